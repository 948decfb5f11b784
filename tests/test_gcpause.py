"""diagnoser.gcpause: the collector is off inside, restored after, and overlapping blocks (serve's threads)
leave it as it was before the first of them."""

from __future__ import annotations

import gc
import threading

from diagnoser import gcpause


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
