"""Log source: read a server log from a file or stdin (``-``), or follow a growing file across
rotation and truncation. Lines go through the engine adapter's parser; what is not recognised is
counted, binary junk is skipped and counted, nothing is fatal."""

from __future__ import annotations

import gc
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from diagnoser import gcpause
from diagnoser.model import InputReport, SignalSink

MAX_LINE = 64 * 1024  # longer "lines" are junk (or a server_args line we keep whole up to this)


def _is_junk(raw: bytes) -> bool:
    if b"\x00" in raw:
        return True
    # mostly non-text bytes (not UTF-8 decodable and few printable ASCII characters)
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        printable = sum(1 for b in raw if 32 <= b < 127 or b in (9, 10, 13))
        return printable < 0.8 * len(raw)


CHUNK = 8 * 1024 * 1024  # bulk backfill reads this much at a time
BULK_MIN = 1024 * 1024  # inputs smaller than this are read line by line (no bulk regex to compile)


class _Prepend:
    """A stream with some already-read bytes put back in front."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream = head, stream

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head, b""
            return out
        return self.stream.read(n)


@dataclass(slots=True)
class LogReader:
    """Feeds lines to a parser and keeps the counts for the input report."""

    parser: Any
    report: InputReport
    line_no: int = 0
    # the bulk path's progress: bytes of the input applied so far, and its size when known (a file);
    # ``observer`` is called with the reader after each chunk (a window keeper, a progress line)
    bytes_read: int = 0
    size: int | None = None
    started: float = 0.0  # time.monotonic() when the bulk read began
    observer: Callable[[LogReader], None] | None = None
    bad_stamps: int = 0  # lines whose timestamp no calendar has (also counted in report.errors)

    def feed_raw(self, raw: bytes, line_no: int) -> bool | None:
        """One line without its newline: ``None`` when skipped untouched (blank, junk or an impossible
        stamp, counted as an error), else whether the parser recognised it (False also for a line the
        parser failed on, counted as an error: it may have read the line's time). Does not count the
        line as read."""
        if len(raw) >= MAX_LINE or _is_junk(raw):
            self.report.errors += 1
            return None
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            return None
        try:
            return bool(self.parser.feed(line, line_no))
        except Exception as e:  # an impossible line (BadLine), or a parser bug on one odd line: skip it
            self.report.errors += 1
            if getattr(e, "reason", None) == "timestamp":
                self.bad_stamps += 1
                return None  # refused before the parser changed anything
            return False  # it may have read the line's time first: not recognised, but not untouched

    def feed_bytes(self, raw: bytes) -> None:
        self.line_no += 1
        self.report.lines_read += 1
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if self.feed_raw(raw, self.line_no):
            self.report.lines_recognized += 1

    def feed_lines(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            self.feed_bytes(raw)

    def feed_stream(self, stream: Any, chunk: int | None = None, bulk_min: int = BULK_MIN, workers: int | None = None) -> None:
        """Read a whole stream in large chunks through the parser's bulk reader when it has one
        (exactly the same result as :meth:`feed_lines`, several times faster).

        ``workers``: processes that parse chunks in parallel (the reading process applies their results
        in file order). ``None`` picks: one per other CPU (up to 3) for a regular file of at least ``PARALLEL_MIN``
        bytes read from a single-threaded process (fork is only safe there), else none.
        """
        bulk_factory = getattr(self.parser, "bulk", None)
        if bulk_factory is None:
            self.feed_lines(stream)
            return
        chunk = chunk or CHUNK
        head = stream.read(bulk_min) if bulk_min > 0 else b""
        if bulk_min > 0 and len(head) < bulk_min:  # the whole input is small: the line path starts faster
            self.feed_lines(io.BytesIO(head))
            return
        if workers is None:
            workers = _auto_workers(stream)
        self.size = _size(stream)
        self.started = time.monotonic()
        bulk = bulk_factory()
        # a regular file is memory-mapped to find the chunks' ends; each chunk is then read with pread
        # by whoever parses it (worker processes, forked after the mapping, read their own)
        start = _offset(stream, len(head)) if hasattr(bulk, "block_parser") else None
        mapped = _map(stream) if start is not None else None
        jobs: Iterator[Any] = _ranges(mapped, start or 0, len(mapped), chunk) if mapped is not None else _blocks(_Prepend(head, stream), chunk)
        # the bulk reader makes millions of short-lived objects; the cyclic GC would rescan them all
        # (paused with the shared count: serve may run a fleet pass in another thread meanwhile)
        global _MAP, _FD
        _MAP, _FD = mapped, _fileno(stream) if mapped is not None else None
        with gcpause.paused():
            try:
                if workers > 0 and hasattr(bulk, "block_parser"):
                    self._read_parallel(bulk, jobs, workers)
                else:
                    for job in jobs:
                        self._apply_done(bulk, job, None)
            finally:
                _MAP = _FD = None
                if mapped is not None:
                    mapped.close()

    def _read_parallel(self, bulk: Any, jobs: Iterator[Any], workers: int) -> None:
        """Chunks parsed by a pool of forked workers (:meth:`BlockParser.parse` is a pure function of the
        bytes), applied here in file order; at most two chunks per worker are in flight. A chunk of a
        memory-mapped file travels as its (start, end) only."""
        import multiprocessing
        import shutil
        import tempfile
        from collections import deque

        global _RESULTS
        # a chunk's result (a few MB of columns) is handed over in a file in memory (/dev/shm) rather than
        # through the pool's pipe, which moves it several times slower; set before the workers fork
        try:
            _RESULTS = tempfile.mkdtemp(prefix="diagnoser-log-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        except OSError:
            _RESULTS = None
        pending: deque[tuple[Any, Any]] = deque()
        try:
            try:
                pool = _fork_pool(multiprocessing, workers)
            except (OSError, ValueError, ImportError):  # no fork, no /dev/shm, process limits: read here
                for job in jobs:
                    self._apply_done(bulk, job, None)
                return
            with pool:
                ok = True  # after the first worker that fails or hangs, every chunk is parsed here
                for job in jobs:
                    pending.append((job, pool.apply_async(_worker_parse, (job,)) if ok and job is not None else None))
                    while pending and (len(pending) > 2 * workers or not ok):
                        job_, res = pending.popleft()
                        ok = self._apply_done(bulk, job_, res if ok else None) and ok
                while pending:
                    job_, res = pending.popleft()
                    ok = self._apply_done(bulk, job_, res if ok else None) and ok
        finally:
            if _RESULTS is not None:
                shutil.rmtree(_RESULTS, ignore_errors=True)
                _RESULTS = None

    def _apply_done(self, bulk: Any, job: bytes | tuple[int, int] | None, result: Any) -> bool:
        """Apply one chunk in file order: ``job`` is its bytes, its (start, end) in the mapped file, or
        None for an over-long line (junk); ``result`` the worker's pending parse, or None to parse here.
        False when the worker failed or hung (the chunk is then parsed here)."""
        if job is None:
            self._count_junk_line()
            return True
        ok = self._apply(bulk, job, result)
        if isinstance(job, tuple):
            self.bytes_read = job[1] + 1  # the chunk and its newline
        else:
            self.bytes_read += len(job) + 1
        if self.observer is not None:
            self.observer(self)
        return ok

    def _apply(self, bulk: Any, job: bytes | tuple[int, int], result: Any) -> bool:
        if not hasattr(bulk, "block_parser"):  # a bulk reader without the two halves
            self._feed_block(bulk, _chunk(job))
            return True
        ok = True
        parsed = None
        if result is not None:
            try:
                parsed = _received(result.get(timeout=WORKER_TIMEOUT))
            except Exception:  # a worker that failed, died (memory, signal) or hangs
                ok = False
        if parsed is None:
            parsed = bulk.block_parser.parse(_chunk(job))
        n = parsed["n"]
        first = self.line_no + 1
        self.line_no += n
        self.report.lines_read += n
        self.report.lines_recognized += bulk.apply(parsed, first, self.feed_raw)
        return ok

    def _count_junk_line(self) -> None:
        self.line_no += 1
        self.report.lines_read += 1
        self.report.errors += 1

    def skip_overlong(self) -> None:
        """A line of :data:`MAX_LINE` bytes or more that a follower dropped unread: counted as junk."""
        self._count_junk_line()

    def _feed_block(self, bulk: Any, block: bytes) -> None:
        n = block.count(b"\n") + 1
        first = self.line_no + 1
        self.line_no += n
        self.report.lines_read += n
        self.report.lines_recognized += bulk.feed_block(block, first, self.feed_raw)


PARALLEL_MIN = 64 * 1024 * 1024  # files at least this big are parsed by worker processes
WORKER_TIMEOUT = 60.0  # a chunk takes well under a second; past this its worker is presumed stuck


def _auto_workers(stream: Any) -> int:
    import threading

    env = os.environ.get("DIAGNOSER_LOG_WORKERS")
    if env is not None and env.strip().isdigit():
        return int(env)
    cpus = _cpus()
    if cpus < 2 or threading.active_count() > 1 or sys.platform == "win32":
        return 0
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 0
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_size < PARALLEL_MIN:
        return 0
    # this process applies every chunk's result (in file order), which costs about as much as parsing
    # one: one worker per other CPU, and more than three never pays (bench/bench_log_backfill.py)
    return min(cpus - 1, 3)


def _size(stream: Any) -> int | None:
    """The size of a regular file being read, else None (a pipe, stdin, a stream in memory)."""
    import stat

    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _cpus() -> int:
    """CPUs this process may run on (its affinity and a cgroup CPU quota: :func:`diagnoser.forkmap.cpu_count`)."""
    from diagnoser.forkmap import cpu_count

    return cpu_count()


_WORKER: Any = None
_MAP: Any = None  # the memory-mapped file being read in parallel (inherited by the forked workers)
_FD: int | None = None  # its descriptor: chunks are read with pread (also inherited)
_RESULTS: str | None = None  # where workers hand their results over (inherited by the forked workers)
_HANDED = 0  # results handed over by this worker


def _fork_pool(multiprocessing: Any, workers: int) -> Any:
    """A pool of forked workers that the pool's terminate() can always end.

    A forked worker inherits the reading process's signal handlers. With a Python-level SIGTERM handler
    there (any library's), a SIGTERM that arrives before the worker's initializer resets it runs that
    handler in the worker instead of ending it; a small file is read before its workers have even
    started, so terminate() came that early, and join() then waited forever for an idle worker. So the
    workers are forked with SIGTERM blocked (the pool's helper threads, made here, keep it blocked, so
    a worker they fork later is born the same way), and each unblocks it once its handler is the
    default: a SIGTERM sent in between stays pending and ends it then. The reading process's own
    handler is untouched; a SIGTERM it gets meanwhile is delivered when the mask is restored."""
    import signal

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_init() -> None:
    global _WORKER
    import signal

    from diagnoser.engines.sglang.logfast import BlockParser
    from diagnoser.engines.sglang.logs import SGLangLogParser

    # forked with SIGTERM blocked (_fork_pool): make it end the worker, then let it in
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reading process's to handle
    gc.disable()
    _WORKER = BlockParser()
    _WORKER.parser_cls = SGLangLogParser  # bare batch heads are asked of the reference parser (logfast._only_ticks)


def _chunk(job: bytes | tuple[int, int]) -> bytes:
    """A chunk's bytes: the job itself, or its (start, end) in the memory-mapped file, read with
    ``pread``: a slice of the mapping would leave every page it touched resident in this process, so
    that reading a 1.5 GB file grew each process by 1.5 GB (the mapping only finds the chunks' ends)."""
    if isinstance(job, bytes):
        return job
    start, end = job
    if _FD is not None and hasattr(os, "pread"):  # not on Windows: the slice there
        try:
            parts = []
            at = start
            while at < end:
                got = os.pread(_FD, end - at, at)
                if not got:  # the file was cut short under us: what is left of the chunk
                    break
                parts.append(got)
                at += len(got)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError:
            pass
    return _MAP[start:end]  # type: ignore[no-any-return]


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _worker_parse(job: bytes | tuple[int, int]) -> dict[str, Any] | str:
    return _handed(_WORKER.parse(_chunk(job)))


def _handed(parsed: dict[str, Any]) -> dict[str, Any] | str:
    """In a worker: the result written to a file in :data:`_RESULTS` (its path is returned), or the
    result itself when that cannot be done (it then goes through the pool's pipe)."""
    if _RESULTS is None:
        return parsed
    import pickle

    global _HANDED
    _HANDED += 1
    path = os.path.join(_RESULTS, f"{os.getpid()}-{_HANDED}")
    try:
        with open(path, "wb") as fh:
            pickle.dump(parsed, fh, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        return parsed
    return path


def _received(result: dict[str, Any] | str) -> dict[str, Any]:
    """In the reading process: a worker's result, read back (and removed) when it came as a file."""
    if not isinstance(result, str):
        return result
    import pickle

    try:
        with open(result, "rb") as fh:
            return pickle.load(fh)  # written by our own worker a moment ago
    finally:
        os.unlink(result)


def _offset(stream: Any, already: int) -> int | None:
    """Where in the file the unread part begins (``already`` bytes were read ahead), or None."""
    try:
        return int(stream.tell()) - already
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _map(stream: Any) -> Any:
    """A read-only memory map of a regular file, or None (not a file, empty, or mmap refused)."""
    import mmap

    try:
        return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _blocks(stream: Any, chunk: int) -> Iterator[bytes | None]:
    """Whole lines, about ``chunk`` bytes at a time (no final newline); ``None`` for each line longer
    than :data:`MAX_LINE`, which is dropped (counted as junk) without being held in memory."""
    rest = b""
    overlong = False  # inside a line already too long to keep: drop bytes up to its newline
    while True:
        data = stream.read(chunk)
        if not data:
            break
        if overlong:
            cut = data.find(b"\n")
            if cut < 0:
                continue
            yield None
            overlong = False
            data = data[cut + 1 :]
        data = rest + data if rest else data
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            if len(rest) > MAX_LINE:
                overlong, rest = True, b""
            continue
        rest = data[cut + 1 :]
        yield data[:cut]
        if len(rest) > MAX_LINE:
            overlong, rest = True, b""
    if overlong:
        yield None
    elif rest:
        yield rest


def _ranges(mm: Any, pos: int, end: int, chunk: int) -> Iterator[tuple[int, int] | None]:
    """:func:`_blocks` over a memory map: (start, end) of whole lines, about ``chunk`` bytes at a time
    (no final newline), and ``None`` for each line of :data:`MAX_LINE` bytes or more that does not
    fit in a chunk (junk either way, never copied).

    The searches touch pages of the mapping (about 2 MB a chunk, with the kernel's fault-around), which
    would stay resident and grow the process by a quarter of the file: each range searched is released
    (``MADV_DONTNEED``: the pages stay in the page cache) before its chunk is handed out."""
    while pos < end:
        if end - pos <= chunk:
            last = mm[end - 1]
            _release(mm, pos, end)
            yield (pos, end - 1 if last == 10 else end)
            return
        cut = mm.rfind(b"\n", pos, pos + chunk)
        if cut < 0:  # the first line is longer than a chunk
            nl = mm.find(b"\n", pos + chunk, end)
            stop = end if nl < 0 else nl
            _release(mm, pos, stop + 1)
            yield None if stop - pos >= MAX_LINE else (pos, stop)
            pos = stop + 1
            continue
        _release(mm, pos, cut + 1)
        yield (pos, cut)
        pos = cut + 1


def _release(mm: Any, start: int, stop: int) -> None:
    """Unmap the pages of ``[start, stop)`` from this process (they are read again on the next touch)."""
    import mmap

    advise = getattr(mm, "madvise", None)
    if advise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    a = start - start % mmap.PAGESIZE
    n = min(stop, len(mm)) - a
    if n <= 0:
        return
    try:
        advise(mmap.MADV_DONTNEED, a, n)
    except (OSError, ValueError):
        pass


def open_log_reader(adapter: Any, sink: SignalSink, source: str, head: bytes | None = None) -> LogReader:
    """A reader with the adapter's parser; an adapter that picks the engine per input (``for_log``) is
    shown the log's first bytes (``head``, else read from the file) and answers the engine's adapter."""
    name = "stdin" if source == "-" else os.path.basename(source)
    report = InputReport(kind="log", source=source)
    pick = getattr(adapter, "for_log", None)
    if pick is not None:
        if head is None and source != "-":
            head = _head(source)
        adapter = pick(head, sink)
    return LogReader(adapter.log_parser(sink, name), report)


HEAD = 256 * 1024  # the bytes of a log an engine is told from


def _peek(stream: Any) -> bytes | None:
    """A stream's first bytes without consuming them (a buffered stream's peek, or read and seek back)."""
    try:
        if hasattr(stream, "peek"):
            return bytes(stream.peek(HEAD)[:HEAD])
        if stream.seekable():
            pos = stream.tell()
            got = stream.read(HEAD)
            stream.seek(pos)
            return bytes(got)
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _head(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(HEAD)
    except OSError:
        return None


def read_log(adapter: Any, sink: SignalSink, source: str, stream: IO[bytes] | None = None,
             observer: Callable[[LogReader], None] | None = None) -> LogReader:
    """Read a whole log (file path, or ``-`` for stdin) and return the reader with its counts.
    ``observer(reader)`` is called after each chunk of the bulk path (files over 1 MB) and once after
    the last line, before the parser's end-of-log summary."""
    if stream is None and source == "-":
        stream = sys.stdin.buffer
    head = _peek(stream) if stream is not None and hasattr(adapter, "for_log") else None
    reader = open_log_reader(adapter, sink, source, head)
    reader.observer = observer
    if stream is not None:
        reader.feed_stream(stream)
    else:
        try:
            with open(source, "rb") as fh:
                reader.feed_stream(fh)
        except FileNotFoundError:
            reader.report.messages.append(f"Log file {source} does not exist. Check the path, or pass --log - to read stdin.")
            reader.report.errors += 1
        except IsADirectoryError:
            reader.report.messages.append(f"{source} is a directory, not a log file. Pass the server's log file itself.")
            reader.report.errors += 1
        except PermissionError:
            reader.report.messages.append(f"Log file {source} cannot be read (permission denied). Run as a user who can read it.")
            reader.report.errors += 1
    if observer is not None:
        observer(reader)
    finish_report(adapter, reader)
    return reader


def finish_report(adapter: Any, reader: LogReader) -> None:
    rep = reader.report
    finish = getattr(reader.parser, "finish", None)
    if finish is not None:
        finish()
    summary = getattr(reader.parser, "access_summary", None)
    if summary is not None:
        acc = summary()
        if acc["requests"]:
            codes = ", ".join(f"{k}: {v}" for k, v in acc["status"].items())
            rep.messages.append(f"Access log: {acc['requests']} request(s) by status code ({codes}).")
    if rep.lines_read and not rep.lines_recognized and not rep.messages:
        formats = "; ".join(adapter.expected_log_formats)
        rep.messages.append(
            f"No line of {rep.source} was recognised as an SGLang log line ({rep.lines_read} read). "
            f"Expected {formats}. Check that this is the server's own log at --log-level info."
        )
    lines_bad = rep.errors
    if lines_bad and rep.lines_read:
        why = "binary or over-long"
        if reader.bad_stamps:
            why = (f"{reader.bad_stamps} with a timestamp no calendar has, e.g. [0000-00-00 …]"
                   + ("" if reader.bad_stamps == lines_bad else f"; {lines_bad - reader.bad_stamps} binary or over-long"))
        rep.messages.append(f"Skipped {lines_bad} unreadable line(s) ({why}) in {rep.source}.")
    dropped = getattr(reader.parser, "dropped_values", 0)
    if dropped:  # fields of readable lines: an input problem too, counted once
        reader.parser.dropped_values = 0
        rep.errors += dropped
        rep.messages.append(f"Dropped {dropped} value(s) that no scheduler line holds (NaN, ±Inf or negative) in {rep.source}; "
                            "the rest of those lines was read.")


FOLLOW_READ = 1024 * 1024  # a follower reads this much at a time (memory per poll stays about this)


class LogFollower:
    """Follow a growing file like ``tail -F``: survives rotation (new inode) and truncation.

    Call :meth:`poll` periodically; it feeds every new complete line to the reader. A partial last
    line is kept until its newline arrives, but never more than :data:`MAX_LINE` bytes of it: a longer
    line (a file that never writes a newline, a sparse or binary file) is dropped and counted as junk, and
    its bytes are skipped up to the next newline, so memory stays bounded whatever the file holds. Each
    poll reads at most ``max_bytes`` (in :data:`FOLLOW_READ` pieces); the rest waits for the next poll.
    """

    def __init__(self, reader: LogReader, path: str, from_start: bool = True) -> None:
        self.reader = reader
        self.path = path
        self.fh: IO[bytes] | None = None
        self.inode: int | None = None
        self.pos = 0
        self.partial = b""
        self.from_start = from_start
        self.rotations = 0
        self.truncations = 0
        self.skipping = False  # inside an over-long line: drop bytes up to its newline
        self.overlong = 0  # lines dropped for being over-long

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")
        except OSError:
            return False
        st = os.fstat(fh.fileno())
        self.fh, self.inode = fh, st.st_ino
        if not self.from_start:
            fh.seek(0, os.SEEK_END)
            self.from_start = True
        self.pos = fh.tell()
        return True

    def poll(self, max_bytes: int = 64 * 1024 * 1024) -> int:
        """Read what is new. Returns the number of complete lines fed."""
        if self.fh is None and not self._open():
            return 0
        assert self.fh is not None
        fed = self._drain(max_bytes)
        try:
            st = os.stat(self.path)
        except OSError:
            return fed
        if st.st_ino != self.inode:  # rotated: finish the old file, then start the new one
            fed += self._drain(max_bytes)
            if self.partial:
                self.reader.feed_bytes(self.partial)
                self.partial = b""
                fed += 1
            elif self.skipping:  # the old file ended inside an over-long line
                self._skip()
            self.skipping = False
            self.fh.close()
            self.fh = None
            self.rotations += 1
            if self._open():
                fed += self._drain(max_bytes)
        elif st.st_size < self.pos:  # truncated in place (copytruncate)
            self.truncations += 1
            self.fh.seek(0)
            self.pos = 0
            self.partial = b""
            self.skipping = False
            fed += self._drain(max_bytes)
        return fed

    def _skip(self) -> None:
        self.overlong += 1
        skip = getattr(self.reader, "skip_overlong", None)
        if skip is not None:
            skip()
        else:  # a reader without it: a NUL line, which every reader counts as junk
            self.reader.feed_bytes(b"\x00")

    def _drain(self, max_bytes: int) -> int:
        assert self.fh is not None
        fed = 0
        left = max_bytes
        while left > 0:
            data = self.fh.read(min(FOLLOW_READ, left))
            if not data:
                break
            left -= len(data)
            self.pos = self.fh.tell()
            if self.skipping:
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                self.skipping = False
                self._skip()
                fed += 1
                data = data[cut + 1:]
            data = self.partial + data if self.partial else data
            lines = data.split(b"\n")
            self.partial = lines.pop()
            for raw in lines:
                if len(raw) >= MAX_LINE:  # arrived whole in one read, but still too long: junk
                    self._skip()
                else:
                    self.reader.feed_bytes(raw)
            fed += len(lines)
            if len(self.partial) >= MAX_LINE:
                self.partial = b""
                self.skipping = True
        return fed

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
