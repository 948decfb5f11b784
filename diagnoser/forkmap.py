"""A CPU-bound map split over forked worker processes, the calling process taking part itself.

A fleet pass judges each of thousands of targets on its own (the target rules read one timeline each), and
Python runs one thread of it at a time: on a machine with more than one core the rest wait. :func:`split_map`
cuts the items into contiguous chunks and puts their numbers in a queue (a pipe, written whole before any
fork: each 4-byte read takes the next number, and an empty pipe reads as its end), forks a child per
worker but one, and lets this process and the children take chunks from the queue until it is empty: a
process that is slower, or busy with other work first (``meanwhile``: what the caller needs done in this
process, such as the parts of a report that do not wait for the findings), simply takes fewer. A child sees
the parent's memory as it was at the fork (copy on write: nothing is sent to it) and sends back only its
results, pickled, through a pipe. The results come back in the chunks' order, whoever computed them.

It never changes an answer, only how long it takes:

* Once the queue is empty the parent reads each child within a deadline (:data:`DEADLINE_FACTOR` times
  the time it spent on chunks itself, and at least :data:`DEADLINE_MIN_S`). Any chunk whose result did not
  come back (its child raised, died, sent something unreadable or too large, missed the deadline, or could
  not be forked) is computed here, in the parent; the cause is counted in :data:`stats` and kept as one
  sentence (:func:`last_problem`).
* A child leaves with ``os._exit`` (no ``atexit`` handlers, no second flush of the parent's buffered
  output) and prints nothing: what it raised travels back as text. It dies with its parent (Linux
  ``PR_SET_PDEATHSIG``).
* Forking is used only on Linux, with more than one CPU available to this process (its affinity and a
  cgroup CPU quota, as a container sets), and for at least ``min_items`` items; ``DIAGNOSER_WORKERS=1``
  turns it off (``DIAGNOSER_WORKERS=N`` sets the count).
* ``fn`` must be a pure function of its chunk (it may read anything the parent holds; what it writes stays
  in the child) returning something picklable.

Forking a process that runs other threads (``diagnose serve``) copies only the calling thread; a lock
another thread held at that moment stays held in the child. The work handed to a child takes no lock
(the rules read timelines and compute), and the deadline bounds the case where it would: its chunks are
then computed in the parent.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
DEADLINE_FACTOR = 4.0  # once the queue is empty a child is at most one chunk from done: this is generous
DEADLINE_MIN_S = 20.0
MAX_RESULT_BYTES = 2 << 30  # a child's pickled result larger than this is refused (its share runs here)


@dataclass
class Stats:
    """What the splits of this process did (for tests and ``--verbose`` figures)."""

    splits: int = 0
    forked: int = 0
    fell_back: int = 0  # shares run in the parent after their child failed
    problems: list[str] = field(default_factory=list)


stats = Stats()


def last_problem() -> str:
    return stats.problems[-1] if stats.problems else ""


def cpu_count() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 or v1 CPU quota when one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def _cgroup_quota() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            q, p = fh.read().split()[:2]
        return None if q == "max" else int(q) / int(p)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as fh:
            q = int(fh.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as fh:
            p = int(fh.read())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


def workers_for(n_items: int, min_items: int) -> int:
    """How many processes to split ``n_items`` over: 1 below ``min_items``, off Linux or with one CPU;
    ``DIAGNOSER_WORKERS`` overrides the CPU count (1 turns the split off)."""
    env = os.environ.get("DIAGNOSER_WORKERS", "").strip()
    if env:
        try:
            want = int(env)
        except ValueError:
            want = 0
        if want >= 1:
            return max(1, min(want, MAX_WORKERS, n_items))
    if n_items < min_items or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    return max(1, min(cpu_count(), MAX_WORKERS, n_items // max(1, min_items // 2)))


def shares(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous (start, end) ranges covering ``range(n)``, sizes differing by at most one."""
    parts = max(1, min(parts, n)) if n else 1
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


CHUNKS_PER_WORKER = 16  # the queue's grain: a process finishing last is at most one chunk behind


@dataclass
class _Child:
    pid: int
    fd: int
    buf: bytearray = field(default_factory=bytearray)
    done: bool = False
    failed: str = ""  # why its answer is not used (its chunks are then computed in the parent)


def split_map(fn: Callable[[Sequence[T]], R], items: Sequence[T], workers: int,
              meanwhile: Callable[[], None] | None = None) -> list[R]:
    """``[fn(chunk) for chunk in chunks]`` over contiguous chunks of ``items`` (one chunk with one worker),
    computed by this process and ``workers - 1`` forked children taking chunks from one queue; this process
    runs ``meanwhile()`` first (always, once, whether or not it forks). See the module doc for what happens
    when a child fails."""
    parts = shares(len(items), workers * CHUNKS_PER_WORKER if workers > 1 else 1)
    if workers <= 1 or len(parts) <= 1 or not hasattr(os, "fork"):
        if meanwhile is not None:
            meanwhile()
        return [fn(items[lo:hi]) for lo, hi in parts]
    stats.splits += 1
    queue = _queue(len(parts))
    children: list[_Child] = []
    try:
        if queue is not None:
            for _ in range(workers - 1):
                child = _fork(fn, items, parts, queue)
                if child is None:  # fork refused (no memory, a process limit): the others take its chunks
                    _problem(f"a worker process could not be started ({_fork_error}); its chunks were computed by the others")
                    break
                children.append(child)
                stats.forked += 1
        if meanwhile is not None:
            meanwhile()
        t0 = time.monotonic()
        got: dict[int, R] = _take(fn, items, parts, queue) if queue is not None else {}
        own = time.monotonic() - t0
        if children:
            wait = max(DEADLINE_MIN_S, DEADLINE_FACTOR * own)
            _drain(children, time.monotonic() + wait, wait)
            for c in children:
                theirs = _result(c)
                if theirs is not None:
                    got.update(theirs)
        missing = [i for i in range(len(parts)) if i not in got]
        if missing and children:
            stats.fell_back += 1
        for i in missing:  # a chunk no child answered for: computed here
            lo, hi = parts[i]
            got[i] = fn(items[lo:hi])
        return [got[i] for i in range(len(parts))]
    finally:
        if queue is not None:
            _close(queue)
        for c in children:
            _reap(c)


_fork_error = ""


def _queue(n: int) -> int | None:
    """A pipe holding the chunk numbers 0..n-1 (4 bytes each, written whole, write end closed): its read
    end, or None when no pipe could be made (the caller then computes every chunk itself)."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        data = struct.pack(f"<{n}I", *range(n))
        if len(data) > 65536:  # more than a pipe holds unread (never at MAX_WORKERS x CHUNKS_PER_WORKER chunks)
            raise OSError("too many chunks")
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except OSError:
        os.close(r)
        return None
    finally:
        os.close(w)
    return r


def _next(queue: int) -> int | None:
    """The next chunk's number from the queue, None once it is empty."""
    try:
        tok = os.read(queue, 4)
    except OSError:
        return None
    return struct.unpack("<I", tok)[0] if len(tok) == 4 else None


def _take(fn: Callable[[Sequence[T]], Any], items: Sequence[T], parts: list[tuple[int, int]], queue: int,
          keep: Callable[[Any], Any] | None = None, got: dict[int, Any] | None = None) -> dict[int, Any]:
    """``fn`` of each chunk taken from the queue until it is empty, by chunk number, written into ``got`` as
    each is computed (so that what was done survives an exception); ``keep``: what is kept of each result."""
    got = {} if got is None else got
    while (i := _next(queue)) is not None:
        lo, hi = parts[i]
        got[i] = fn(items[lo:hi]) if keep is None else keep(fn(items[lo:hi]))
    return got


def _fork(fn: Callable[[Sequence[T]], R], items: Sequence[T], parts: list[tuple[int, int]], queue: int) -> _Child | None:
    global _fork_error
    try:
        r, w = os.pipe()
    except OSError as e:
        _fork_error = f"{type(e).__name__}: {e}"
        return None
    sys.stdout.flush()  # (what the parent buffered is written once, not again by a child)
    sys.stderr.flush()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns on fork beside other threads: see the module doc
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        _fork_error = f"{type(e).__name__}: {e}"
        return None
    if pid == 0:  # the child: take chunks, send their results, leave; nothing it does reaches the parent's code paths
        code = 1
        try:
            os.close(r)
            _die_with_parent()
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
            except ValueError:
                pass
            # each chunk's result pickled as soon as it is computed, while other chunks are still queued: at
            # the end only the bytes are left to send
            done: dict[int, bytes] = {}
            try:
                _take(fn, items, parts, queue, keep=partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL), got=done)
                payload = pickle.dumps(("ok", done), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as e:  # noqa: BLE001 — sent back as text with what was done; the parent computes the rest
                payload = pickle.dumps(("error", f"{type(e).__name__}: {e}"[:300], done), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view[: 1 << 20]):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return _Child(pid=pid, fd=r)


def _die_with_parent() -> None:
    """Linux: this child gets SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except Exception:  # noqa: S110 — without it an orphan still ends: its write fails once the parent is gone
        pass


def _drain(children: list[_Child], deadline: float, wait: float) -> None:
    """Read every child's pipe to its end, or until the deadline."""
    open_ = {c.fd: c for c in children if not c.done}
    while open_:
        left = deadline - time.monotonic()
        if left <= 0:
            for c in open_.values():
                c.failed = f"a worker process did not answer within {wait:.0f} s ({DEADLINE_FACTOR:g}x this process's own chunks)"
                c.buf = bytearray()
                c.done = True
                os.kill(c.pid, signal.SIGKILL)
            return
        ready, _, _ = select.select(list(open_), [], [], min(left, 1.0))
        for fd in ready:
            c = open_[fd]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                c.buf += chunk
                if len(c.buf) > MAX_RESULT_BYTES:
                    c.failed = f"a worker process sent more than the result cap ({MAX_RESULT_BYTES >> 20} MiB)"
                    c.buf = bytearray()
                    os.kill(c.pid, signal.SIGKILL)
                    del open_[fd]
                    c.done = True
                continue
            del open_[fd]
            c.done = True


def _result(c: _Child) -> dict[int, Any] | None:
    """The chunks' results a child sent ({} or a part when it failed: the sentence is kept), None when none."""
    got: dict[int, Any] | None = None
    if not c.failed and not c.buf:
        c.failed = "a worker process ended without an answer"
    if not c.failed:
        try:
            answer = pickle.loads(c.buf)
            frames = {i: pickle.loads(b) for i, b in answer[-1].items()}
        except Exception as e:  # noqa: BLE001 — a truncated or garbled answer
            c.failed = f"a worker process's answer could not be read ({type(e).__name__})"
        else:
            if answer[0] == "ok":
                return frames
            c.failed, got = f"a worker process failed ({answer[1]})", frames
        finally:
            c.buf = bytearray()
    _problem(f"{c.failed}; its chunks were computed in this process")
    return got


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _reap(c: _Child) -> None:
    if c.fd >= 0:
        _close(c.fd)
        c.fd = -1
    if c.pid:
        try:
            if not c.done:
                os.kill(c.pid, signal.SIGKILL)
            os.waitpid(c.pid, 0)
        except (ChildProcessError, ProcessLookupError, OSError):
            pass
        c.pid = 0


def _problem(text: str) -> None:
    stats.problems.append(text)
    del stats.problems[:-20]
