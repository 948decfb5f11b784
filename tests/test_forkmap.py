"""diagnoser/forkmap.py: a map split over forked workers gives the serial answer, whatever a worker does.

Every way a worker can fail (it raises, dies, hangs, sends too much, cannot be forked, deadlocks on a lock
another thread held at the fork) ends with its share computed in the parent and the same result; the
children print nothing and leave no process behind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from diagnoser import forkmap

PARENT = os.getpid()
ITEMS = list(range(1000))


def squares(share: Sequence[int]) -> list[tuple[int, int, bool]]:
    """Each item's square, and whether it was computed in a worker. A chunk takes this process 20 ms, a
    worker 5 ms: every worker starts and takes chunks before this process has taken them all."""
    worker = os.getpid() != PARENT
    time.sleep(0.005 if worker else 0.02)
    return [(i, i * i, worker) for i in share]


def flat(results: list[list[tuple[int, int, bool]]]) -> list[tuple[int, int]]:
    return [(i, sq) for part in results for i, sq, _ in part]


@pytest.fixture(autouse=True)
def _fresh_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkmap, "stats", forkmap.Stats())
    monkeypatch.delenv("DIAGNOSER_WORKERS", raising=False)


def _no_children_left() -> None:
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_shares_cover_the_items_in_order() -> None:
    for n in (0, 1, 2, 7, 1000):
        for w in (1, 2, 3, 8):
            parts = forkmap.shares(n, w)
            assert [i for lo, hi in parts for i in range(lo, hi)] == list(range(n))
            sizes = [hi - lo for lo, hi in parts]
            assert max(sizes) - min(sizes) <= 1


def test_the_split_gives_the_serial_answer_and_uses_workers(capfd: pytest.CaptureFixture[str]) -> None:
    got = forkmap.split_map(squares, ITEMS, 3)
    assert flat(got) == [(i, i * i) for i in ITEMS]
    assert len(got) == 3 * forkmap.CHUNKS_PER_WORKER  # chunks, in order, whoever computed them
    assert any(w for part in got for _, _, w in part)
    assert forkmap.stats.forked == 2 and forkmap.stats.fell_back == 0
    assert capfd.readouterr() == ("", "")
    _no_children_left()


def test_the_workers_take_the_chunks_while_this_process_is_busy() -> None:
    """The queue balances the work: while this process runs ``meanwhile`` the workers take the chunks."""
    ran: list[int] = []

    def busy() -> None:
        ran.append(os.getpid())
        time.sleep(2.0)

    def slow(share: Sequence[int]) -> list[tuple[int, int, bool]]:
        time.sleep(0.01)
        return squares(share)

    got = forkmap.split_map(slow, ITEMS, 2, meanwhile=busy)
    assert flat(got) == [(i, i * i) for i in ITEMS] and ran == [PARENT]
    by_worker = sum(1 for part in got if part and part[0][2])
    assert by_worker >= 0.75 * len(got), f"{by_worker} of {len(got)} chunks computed by the worker"
    ran.clear()
    assert flat(forkmap.split_map(squares, ITEMS, 1, meanwhile=busy)) == [(i, i * i) for i in ITEMS] and ran == [PARENT]


def test_one_worker_or_one_item_runs_here() -> None:
    assert flat(forkmap.split_map(squares, ITEMS, 1)) == [(i, i * i) for i in ITEMS]
    assert flat(forkmap.split_map(squares, [5], 4)) == [(5, 25)]
    assert forkmap.split_map(squares, [], 4) == [[]]
    assert forkmap.stats.forked == 0


def _fails_in_a_worker(how: str) -> Any:
    def fn(share: Sequence[int]) -> list[tuple[int, int, bool]]:
        if os.getpid() != PARENT:
            if how == "raise":
                raise ValueError("a rule broke in the worker")
            if how == "die":
                os._exit(3)
            if how == "hang":
                time.sleep(60)
            if how == "big":
                return [(i, i * i, True) for i in range(300_000)]
        return squares(share)
    return fn


@pytest.mark.parametrize("how, said", [("raise", "failed (ValueError: a rule broke in the worker)"),
                                       ("die", "ended without an answer"),
                                       ("hang", "did not answer within"),
                                       ("big", "more than the result cap")])
def test_a_failing_worker_has_its_share_run_here(how: str, said: str, monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(forkmap, "DEADLINE_MIN_S", 1.0)
    monkeypatch.setattr(forkmap, "MAX_RESULT_BYTES", 1 << 20)
    t0 = time.monotonic()
    got = forkmap.split_map(_fails_in_a_worker(how), ITEMS, 2)
    assert flat(got) == [(i, i * i) for i in ITEMS]
    assert not any(w for part in got for _, _, w in part)  # both shares computed here
    assert forkmap.stats.fell_back == 1 and said in forkmap.last_problem()
    assert time.monotonic() - t0 < 30
    assert capfd.readouterr() == ("", "")  # the worker printed nothing, not even its traceback
    _no_children_left()


def test_a_refused_fork_runs_the_share_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    got = forkmap.split_map(squares, ITEMS, 3)
    assert flat(got) == [(i, i * i) for i in ITEMS]
    assert forkmap.stats.forked == 0 and "could not be started" in forkmap.last_problem()


def test_without_a_queue_every_chunk_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkmap, "_queue", lambda n: None)
    assert flat(forkmap.split_map(squares, ITEMS, 3)) == [(i, i * i) for i in ITEMS]
    assert forkmap.stats.forked == 0


def test_a_worker_forked_from_a_thread_beside_a_held_lock() -> None:
    """serve forks from its polling thread while other threads run: a lock held elsewhere at the fork stays
    held in the child; work that takes no lock goes on, and work that takes it misses the deadline and is
    run here. Either way the answer is the serial one."""
    held = threading.Lock()
    held.acquire()
    out: dict[str, Any] = {}

    def uses_the_lock(share: Sequence[int]) -> list[tuple[int, int, bool]]:
        if os.getpid() != PARENT:
            with held:  # never released in the child: deadlock
                pass
        return squares(share)

    def run() -> None:
        out["free"] = forkmap.split_map(squares, ITEMS, 2)
        forkmap.DEADLINE_MIN_S, old = 1.0, forkmap.DEADLINE_MIN_S
        try:
            out["locked"] = forkmap.split_map(uses_the_lock, ITEMS, 2)
        finally:
            forkmap.DEADLINE_MIN_S = old

    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    held.release()
    assert flat(out["free"]) == flat(out["locked"]) == [(i, i * i) for i in ITEMS]
    assert any(w for part in out["free"] for _, _, w in part)  # the first split used its worker
    assert forkmap.stats.fell_back == 1
    _no_children_left()


def test_workers_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkmap, "cpu_count", lambda: 4)
    assert forkmap.workers_for(10, 500) == 1  # too few items to pay for a fork
    assert forkmap.workers_for(10_000, 500) == 4
    assert forkmap.workers_for(600, 500) == 2  # a worker needs at least half of min_items
    monkeypatch.setattr(forkmap, "cpu_count", lambda: 1)
    assert forkmap.workers_for(10_000, 500) == 1
    monkeypatch.setenv("DIAGNOSER_WORKERS", "1")
    monkeypatch.setattr(forkmap, "cpu_count", lambda: 4)
    assert forkmap.workers_for(10_000, 500) == 1
    monkeypatch.setenv("DIAGNOSER_WORKERS", "3")
    assert forkmap.workers_for(10_000, 500) == 3
    monkeypatch.setenv("DIAGNOSER_WORKERS", "junk")
    assert forkmap.workers_for(10_000, 500) == 4


def test_cpu_count_reads_a_cgroup_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(forkmap, "_cgroup_quota", lambda: 1.5)
    assert forkmap.cpu_count() == 2
    monkeypatch.setattr(forkmap, "_cgroup_quota", lambda: None)
    assert forkmap.cpu_count() == 4
