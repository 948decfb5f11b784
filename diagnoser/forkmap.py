"""A CPU-bound map split over forked worker processes, the calling process taking a share itself.

A fleet pass judges each of thousands of targets on its own (the target rules read one timeline each), and
Python runs one thread of it at a time: on a machine with more than one core the rest wait. :func:`split_map`
cuts the items into contiguous shares, forks a child per share but the first, runs the first share here
while the children run theirs, and returns the results in the items' order. A child sees the parent's
memory as it was at the fork (copy on write: nothing is sent to it) and sends back only its result,
pickled, through a pipe.

It never changes an answer, only how long it takes:

* The parent computes its own share first, then reads each child within a deadline (:data:`DEADLINE_FACTOR`
  times its own share's time, and at least :data:`DEADLINE_MIN_S`). A child that raised, died, sent
  something unreadable or missed the deadline is killed and its share is run here, in the parent; the
  cause is counted in :data:`stats` and kept as one sentence (:func:`last_problem`).
* A child leaves with ``os._exit`` (no ``atexit`` handlers, no second flush of the parent's buffered
  output) and prints nothing: what it raised travels back as text. It dies with its parent (Linux
  ``PR_SET_PDEATHSIG``).
* Forking is used only on Linux, with more than one CPU available to this process (its affinity and a
  cgroup CPU quota, as a container sets), and for at least ``min_items`` items; ``DIAGNOSER_WORKERS=1``
  turns it off (``DIAGNOSER_WORKERS=N`` sets the count).
* ``fn`` must be a pure function of its share (it may read anything the parent holds; what it writes stays
  in the child) returning something picklable.

Forking a process that runs other threads (``diagnose serve``) copies only the calling thread; a lock
another thread held at that moment stays held in the child. The work handed to a child takes no lock
(the rules read timelines and compute), and the deadline bounds the case where it would: the share is
then run in the parent.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
DEADLINE_FACTOR = 4.0  # a child's share takes about as long as the parent's: this much longer is a failure
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


def shares(n: int, workers: int) -> list[tuple[int, int]]:
    """``workers`` contiguous (start, end) ranges covering ``range(n)``, sizes differing by at most one."""
    workers = max(1, min(workers, n)) if n else 1
    base, extra = divmod(n, workers)
    out, start = [], 0
    for i in range(workers):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


@dataclass
class _Child:
    pid: int
    fd: int
    lo: int
    hi: int
    buf: bytearray = field(default_factory=bytearray)
    done: bool = False
    failed: str = ""  # why its answer is not used (the share then runs in the parent)


def split_map(fn: Callable[[Sequence[T]], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(share) for share in shares]`` over ``workers`` contiguous shares of ``items``: the first share
    here, each other in a forked child (see the module doc for what happens when one fails)."""
    parts = shares(len(items), workers)
    if len(parts) <= 1 or not hasattr(os, "fork"):
        return [fn(items)]
    stats.splits += 1
    children: list[_Child] = []
    try:
        for lo, hi in parts[1:]:
            child = _fork(fn, items, lo, hi)
            if child is None:  # fork refused (no memory, a process limit): this share runs here
                children.append(_Child(pid=0, fd=-1, lo=lo, hi=hi, done=True,
                                       failed=f"a worker process could not be started ({_fork_error})"))
            else:
                children.append(child)
                stats.forked += 1
        t0 = time.monotonic()
        first = fn(items[parts[0][0]:parts[0][1]])
        own = time.monotonic() - t0
        results: list[R] = [first]
        wait = max(DEADLINE_MIN_S, DEADLINE_FACTOR * own)
        _drain(children, time.monotonic() + wait, wait)
        for c in children:
            got = _result(c)
            if got is _FAILED:
                stats.fell_back += 1
                got = fn(items[c.lo:c.hi])
            results.append(got)  # type: ignore[arg-type]
        return results
    finally:
        for c in children:
            _reap(c)


_FAILED = object()
_fork_error = ""


def _fork(fn: Callable[[Sequence[T]], R], items: Sequence[T], lo: int, hi: int) -> _Child | None:
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
    if pid == 0:  # the child: compute, send, leave; nothing it does may reach the parent's code paths
        code = 1
        try:
            os.close(r)
            _die_with_parent()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            try:
                payload = pickle.dumps(("ok", fn(items[lo:hi])), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as e:  # noqa: BLE001 — sent back as text; the parent runs the share again
                payload = pickle.dumps(("error", f"{type(e).__name__}: {e}"[:300]), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(payload)
            while view:
                n = os.write(w, view[: 1 << 20])
                view = view[n:]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return _Child(pid=pid, fd=r, lo=lo, hi=hi)


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
                c.failed = f"a worker process did not answer within {wait:.0f} s ({DEADLINE_FACTOR:g}x this process's own share)"
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


def _result(c: _Child) -> Any:
    if not c.failed and not c.buf:
        c.failed = "a worker process ended without an answer"
    if not c.failed:
        try:
            kind, value = pickle.loads(c.buf)
        except Exception as e:  # noqa: BLE001 — a truncated or garbled answer
            c.failed = f"a worker process's answer could not be read ({type(e).__name__})"
        else:
            if kind == "ok":
                return value
            c.failed = f"a worker process failed ({value})"
        finally:
            c.buf = bytearray()
    _problem(f"{c.failed}; its share ran in this process")
    return _FAILED


def _reap(c: _Child) -> None:
    if c.fd >= 0:
        try:
            os.close(c.fd)
        except OSError:
            pass
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
