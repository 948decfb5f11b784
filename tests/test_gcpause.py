"""diagnoser.gcpause: the collector is off inside, restored after, and overlapping blocks (serve's threads)
leave it as it was before the first of them."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from diagnoser import evaluate as ev
from diagnoser import gcpause
from diagnoser.collect import Collection
from diagnoser.engines import get_adapter
from diagnoser.outputs import report as rep
from diagnoser.timeline import Timeline


def test_paused_restores_the_state_it_found() -> None:
    was = gc.isenabled()
    try:
        for before in (True, False):
            gc.enable() if before else gc.disable()
            with gcpause.paused():
                assert not gc.isenabled()
                with gcpause.paused():
                    assert not gc.isenabled()
                assert not gc.isenabled()  # the outer block is still running
            assert gc.isenabled() is before
    finally:
        gc.enable() if was else gc.disable()


def test_overlapping_blocks_in_threads_restore_it_once_the_last_ends() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        inside, leave = threading.Event(), threading.Event()

        def other() -> None:
            with gcpause.paused():
                inside.set()
                leave.wait(5)

        t = threading.Thread(target=other)
        with gcpause.paused():
            t.start()
            assert inside.wait(5)
        assert not gc.isenabled()  # the first block ended, the thread's has not
        leave.set()
        t.join(5)
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


def test_an_exception_inside_still_restores_it() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        try:
            with gcpause.paused():
                raise KeyError("x")
        except KeyError:
            pass
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()



def test_evaluation_and_the_report_run_with_the_collector_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass's two allocation-heavy steps (bench/bench_fleet.py): the rules and the report document."""
    seen: list[tuple[str, bool]] = []
    check, redact = ev.check_suggestions, rep.redact_owned

    def checking(*a: Any) -> Any:
        seen.append(("rules", gc.isenabled()))
        return check(*a)

    def redacting(*a: Any) -> Any:  # (the report's door)
        seen.append(("report", gc.isenabled()))
        return redact(*a)

    monkeypatch.setattr(ev, "check_suggestions", checking)
    monkeypatch.setattr(rep, "redact_owned", redacting)
    was = gc.isenabled()
    gc.enable()
    try:
        col = Collection(timelines=[Timeline(target="t")])
        doc = rep.build(col, ev.evaluate(col.timelines, get_adapter()))
        assert seen == [("rules", False), ("report", False)] and gc.isenabled() and doc["status"]
    finally:
        gc.enable() if was else gc.disable()
