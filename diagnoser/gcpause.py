"""The cyclic garbage collector paused around work that allocates millions of acyclic objects.

A fleet pass decodes tens of MB of JSON into lists and dicts and builds arrays from them: nothing it makes
refers back to itself, but every container allocated counts towards the collector's thresholds, and each
full collection walks everything alive, the decoded answer included. At 10,000 targets that was about 40 %
of the pass's collection CPU (bench/bench_fleet.py). :func:`paused` turns the collector off for the block
and back on after it, only if it was on before the first of the blocks that overlap (``serve`` runs passes
and the web server in threads: the count is shared, so the last block to leave restores it).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_on = False


@contextmanager
def paused() -> Iterator[None]:
    """``with paused(): …``: no cyclic collection inside; the collector's state before the outermost block
    is restored when the last overlapping block ends (nested and concurrent blocks included)."""
    global _depth, _was_on
    with _lock:
        if _depth == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_on:
                gc.enable()
