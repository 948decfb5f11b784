"""The bulk backfill (engines/sglang/logfast.py) must give exactly what the line-by-line reference parser
gives: same points (time, value, source, rank, order), events, config, version hints, counts.

Proven on every real log in tests/data, cut into chunks of several sizes (shapes and series that
cross chunk boundaries), and on a generated log mixing every common and rare shape, with junk added.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.logs import LogReader, finish_report, open_log_reader
from diagnoser.timeline import Timeline
from tests.conftest import DATA, ROOT


def _real_logs() -> list[Path]:
    files = sorted((DATA / "sglang" / "logs").glob("*"))
    files += sorted(DATA.glob("cases/*/server.log"))
    files += sorted(DATA.glob("sglang-cpu-real/*/server.log"))
    return files


def _state(tl: Timeline, reader: LogReader) -> dict[str, Any]:
    p = reader.parser
    return {
        "series": {k: (s.ts.tolist(), s.values.tolist(), s.sources.tolist()) for k, s in sorted(tl.series.items())},
        "events": [(e.kind, e.ts, e.line_no, e.source, e.fields, e.rank) for e in tl.events],
        "config": {k: (f.value, f.source) for k, f in tl.config.items()},
        "version": (p.version.low, p.version.high, p.version.exact, p.version.reasons),
        "kinds": dict(p.kinds),
        "status": dict(p.status_codes),
        "paths": dict(p.access_paths),
        "access_last": p.access_last,
        "clock": (p.last_ts, p.saw_date, p.untimed_lines),
        "first_stamp_and_devices": (p.first_stamp, sorted(p.graph_labels)),
        "report": reader.report.to_dict(),
    }


def _reference(data: bytes) -> dict[str, Any]:
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    rd.feed_lines(io.BytesIO(data))
    finish_report(ADAPTER, rd)
    return _state(tl, rd)


def _bulk(data: bytes, chunk: int, workers: int = 0) -> tuple[dict[str, Any], int]:
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    rd.feed_stream(io.BytesIO(data), chunk=chunk, bulk_min=0, workers=workers)
    finish_report(ADAPTER, rd)
    return _state(tl, rd), rd.report.lines_recognized


def _assert_same(data: bytes, chunk: int, workers: int = 0) -> dict[str, Any]:
    ref = _reference(data)
    got, _ = _bulk(data, chunk, workers)
    for key in ref:
        assert got[key] == ref[key], f"bulk path differs from the reference parser in {key!r} (chunk={chunk}, workers={workers})"
    return ref


@pytest.mark.parametrize("path", _real_logs(), ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("chunk", [1 << 23, 4096, 300])
def test_bulk_equals_reference_on_real_logs(data_dir: Path, path: Path, chunk: int) -> None:
    ref = _assert_same(path.read_bytes(), chunk)
    assert ref["report"]["lines_recognized"] > 0


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("bench_log_backfill", ROOT / "bench" / "bench_log_backfill.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gen") / "server.log"
    _generator().generate(path, 1.5, seed=11)
    return path.read_bytes()


@pytest.mark.parametrize("chunk", [1 << 23, 65536, 5000])
def test_bulk_equals_reference_on_generated_log(generated: bytes, chunk: int) -> None:
    ref = _assert_same(generated, chunk)
    # the generated mix really exercises the bulk path and the reference-only shapes
    assert ref["kinds"]["decode"] > 1000 and ref["kinds"]["prefill"] > 1000 and ref["kinds"]["access"] > 2000
    assert ref["kinds"]["retraction"] > 0
    assert ("running_reqs", "dp1") in ref["series"] and ("swa_token_usage", "") in ref["series"]
    assert ref["status"]["200"] > 2000 and set(ref["status"]) >= {"200", "500"}


@pytest.mark.parametrize("chunk", [65536, 5000])
def test_parallel_workers_equal_reference_on_generated_log(generated: bytes, chunk: int) -> None:
    """Chunks parsed in forked worker processes (each keeps its own shape memory) and applied in file
    order give exactly the reference result too."""
    ref = _assert_same(generated, chunk, workers=2)
    assert ref["kinds"]["decode"] > 1000


@pytest.mark.parametrize("path", _real_logs()[::4], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parallel_workers_equal_reference_on_real_logs(data_dir: Path, path: Path) -> None:
    ref = _assert_same(path.read_bytes(), 4096, workers=2)
    assert ref["report"]["lines_recognized"] > 0


def _fails(block: bytes) -> dict[str, Any]:
    raise MemoryError("worker out of memory")


def test_parallel_falls_back_to_reading_here(generated: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that fails on a chunk, or a pool that cannot start, costs speed, not results."""
    import multiprocessing

    from diagnoser.sources import logs as logsrc

    monkeypatch.setattr(logsrc, "_worker_parse", _fails)  # forked workers inherit the patch
    _assert_same(generated, 65536, workers=2)

    def no_fork(method: str) -> Any:
        raise OSError("fork is not available here")

    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    _assert_same(generated, 65536, workers=2)


def _hangs(block: bytes) -> dict[str, Any]:
    import time

    time.sleep(3600)
    raise AssertionError("unreachable")


def test_a_hanging_worker_costs_one_timeout_not_the_read(generated: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker stuck for good (a lock inherited through fork, say): after one timeout every chunk is
    parsed in the reading process, with the same result."""
    import time

    from diagnoser.sources import logs as logsrc

    monkeypatch.setattr(logsrc, "_worker_parse", _hangs)
    monkeypatch.setattr(logsrc, "WORKER_TIMEOUT", 1.0)
    t0 = time.monotonic()
    _assert_same(generated, 65536, workers=2)
    assert time.monotonic() - t0 < 30  # one timeout, not one per chunk (the log has ~25 chunks)


def test_parallel_is_chosen_only_for_big_regular_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from diagnoser.sources import logs as logsrc

    monkeypatch.delenv("DIAGNOSER_LOG_WORKERS", raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)

    small = tmp_path / "small.log"
    small.write_bytes(b"x\n" * 10)
    with open(small, "rb") as fh:
        assert logsrc._auto_workers(fh) == 0
    assert logsrc._auto_workers(io.BytesIO(b"x" * (logsrc.PARALLEL_MIN + 1))) == 0  # not a file
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.truncate(logsrc.PARALLEL_MIN)
    with open(big, "rb") as fh:
        cpus = logsrc._cpus()
        assert logsrc._auto_workers(fh) == (min(cpus - 1, 3) if cpus >= 2 else 0)
    monkeypatch.setattr(logsrc, "_cpus", lambda: 8)
    with open(big, "rb") as fh:
        assert logsrc._auto_workers(fh) == 3
    monkeypatch.setattr(logsrc, "_cpus", lambda: 1)
    with open(big, "rb") as fh:
        assert logsrc._auto_workers(fh) == 0


def test_bulk_equals_reference_with_junk_and_odd_lines(generated: bytes) -> None:
    lines = generated.split(b"\n")[:4000]
    odd = [
        b"\x00\x01\x02 binary junk \xff\xfe",
        b"[2026-11-29 09:32:06] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, cuda graph: True, gen throughput (token/s): 1035.84, #queue-req: 35\r",
        "[2026-11-29 09:32:06] INFO:     127.0.0.1:1 - \"GET /caf\u00e9 HTTP/1.1\" 200 OK".encode(),
        b"[2026-11-29 09:32:06] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, cuda graph: True, gen throughput (token/s): 1035.84, #queue-req: 35 \xe9",
        b"x" * 70000 + b" Decode batch, #running-req: 1",
        b"",
        b"   ",
        b"[03:51:54] Decode batch, #running-req: 6, #full token: 2435072, full token usage: 0.92, swa token usage: 0.09, gen throughput (token/s): 24.33",
        b"Prefill batch, #new-seq: 2, #new-token: 34560, #cached-token: 0, token usage: 0.19, #running-req: 45, #queue-req: 17,",
        b"[2026-11-29 09:32:05.250 DP1 TP1] Decode batch, #running-req: 2, #token: 10, token usage: 0.01, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0",
    ]
    mixed: list[bytes] = []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 97 == 0:
            mixed.append(odd[(i // 97) % len(odd)])
    data = b"\n".join(mixed)  # no final newline: the last line is partial
    for chunk, workers in ((1 << 23, 0), (7777, 0), (7777, 2)):
        ref = _assert_same(data, chunk, workers)
    assert ref["report"]["errors"] > 0  # junk was counted
    assert ref["clock"][2] > 0  # untimed lines were ordered by the clock


def test_bulk_equals_reference_with_pasted_and_crash_lines(generated: bytes) -> None:
    """The shapes issue 15 reads (markdown around pasted lines, kubectl/journald heads, an outer stamp,
    tracebacks before any stamp, allocator state, PD and glog lines, cpu/npu graph labels) between bulk
    lines: the bulk reader still gives exactly the line parser's result, pending events and first date too."""
    head = [b'  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2050, in run_batch',
            b"RuntimeError: Decode out of memory. Try to lower your batch size.", b"Avaliable tokens: 2048"]
    lines = generated.split(b"\n")[:4000]
    odd = [
        b"> [2026-11-29 09:32:06 TP0] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, cuda graph: True, gen throughput (token/s): 1035.84, #queue-req: 35",
        b"`[2026-11-29 09:32:06 TP0] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, gen throughput (token/s): 1035.84, #queue-req: 35` \\",
        b"[pod/sglang-0/sglang] [2026-11-29 09:32:06 TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.10, #running-req: 2, #queue-req: 1, #pending-token: 0, cuda graph: False, input throughput (token/s): 10.00",
        b"Nov 29 09:32:06 node python3[11]: [2026-11-29 09:32:06 TP0] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, cpu graph: False, gen throughput (token/s): 1035.84, #queue-req: 35",
        b"[2026-11-29 09:32:06] [2026-11-29 01:32:06 TP0] Decode batch. #running-req: 5, #token: 266623, token usage: 0.61, gen throughput (token/s): 136.00, #queue-req: 0",
        b"[2026-11-29 09:32:06 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        b'  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1800, in forward_extend',
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        b"I1129 09:32:07.155643 104603 transfer_engine.cpp:364] [Metrics] Transfer Engine Throughput: 4.44 MB/s (over last 5s)",
        b"[2026-11-29 09:32:06 DP1 TP1] Prefill batch. #new-seq: 7, #new-token: 200, #cached-token: 0, token usage: 0.07, #running-req: 0, #unbootstrapped-req: 341, #queue-req: 0, #transferring-req: 155 ",
        b"[2026-11-29 09:32:06 TP3] Prefill bootstrap failed for request rank=3 req.rid='ab' req.bootstrap_room=1 with exception KVTransferError(bootstrap_room=1): Aborted by AbortReq.",
        b"max_running_requests is capped to 9 by the mamba state cache (max_mamba_cache_size=47, 5 state slots per request). To raise it: increase --max-mamba-cache-size.",
    ]
    mixed: list[bytes] = list(head)
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 89 == 0:
            mixed.append(odd[(i // 89) % len(odd)])
    data = b"\n".join(mixed) + b"\n"
    for chunk, workers in ((1 << 23, 0), (5555, 0), (5555, 2)):
        ref = _assert_same(data, chunk, workers)
    kinds = {e[0] for e in ref["events"]}
    assert {"frame", "exception", "oom", "oom_detail", "crash_notice", "kv_transfer_rate", "pd_failure", "max_running_requests_reduced"} <= kinds
    assert ref["first_stamp_and_devices"][1] == ["cpu", "cuda"]
    first = next(e for e in ref["events"] if e[2] == 1)  # a frame before any stamp takes the log's first time
    assert first[0] == "frame" and first[1] == min(t for s in ref["series"].values() for t in s[0][:1])


def test_small_inputs_take_the_line_path_large_ones_the_bulk_path(generated: bytes) -> None:
    small, large = generated[:200_000], generated
    for data, bulk in ((small, False), (large, True)):
        tl = Timeline(target="t")
        rd = open_log_reader(ADAPTER, tl, "server.log")
        used: list[bool] = []
        real = rd.parser.bulk
        rd.parser.bulk = lambda real=real, used=used: (used.append(True), real())[1]  # type: ignore[method-assign]
        rd.feed_stream(io.BytesIO(data))
        assert bool(used) == bulk
        assert rd.report.lines_read == data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def test_bulk_is_used_for_files(tmp_path: Path, generated: bytes) -> None:
    """read_log goes through the bulk reader: most lines never reach the per-line parser."""
    from diagnoser.engines.sglang.logs import SGLangLogParser

    tl = Timeline(target="t")
    parser = SGLangLogParser(tl, "server.log")
    bulk = parser.bulk()
    rd = LogReader(parser, open_log_reader(ADAPTER, tl, "x").report)
    calls = {"n": 0}

    def fallback(raw: bytes, line_no: int) -> bool | None:
        calls["n"] += 1
        return rd.feed_raw(raw, line_no)

    lines = generated.split(b"\n")
    recognized = bulk.feed_lines(lines, 1, fallback)
    assert bulk.bulk_lines > 0.8 * len(lines)
    assert calls["n"] < 0.15 * len(lines)
    assert recognized > 0.9 * len(lines)


def _bulk_file(path: Path, chunk: int, workers: int) -> dict[str, Any]:
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    with open(path, "rb") as fh:
        rd.feed_stream(fh, chunk=chunk, bulk_min=0, workers=workers)
    finish_report(ADAPTER, rd)
    return _state(tl, rd)


@pytest.mark.parametrize("final_newline", [True, False])
def test_parallel_workers_read_a_file_through_a_memory_map(tmp_path: Path, generated: bytes, final_newline: bool) -> None:
    """A regular file is memory-mapped and each worker reads its own chunk (no chunk travels through a
    pipe): same result as the reference, with lines longer than a chunk (kept when shorter than the
    64 KiB junk limit, counted as junk when longer) and with or without a final newline."""
    from diagnoser.sources import logs as logsrc

    lines = generated.split(b"\n")[:6000]
    lines[100] = b"[2026-11-29 09:32:06] Cache flushed successfully! " + b"z" * 9000  # longer than a chunk
    lines[2000] = b"y" * 70000  # over the junk limit
    lines[4000] = lines[4001] = b""
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    path = tmp_path / "server.log"
    path.write_bytes(data)
    ref = _reference(data)
    calls: list[int] = []
    real = logsrc._ranges
    logsrc_ranges = lambda *a: (calls.append(1), real(*a))[1]  # noqa: E731
    monkey = pytest.MonkeyPatch()
    monkey.setattr(logsrc, "_ranges", logsrc_ranges)
    try:
        got = _bulk_file(path, 4096, workers=2)
    finally:
        monkey.undo()
    assert calls, "the memory-mapped path was not taken"
    for key in ref:
        assert got[key] == ref[key], f"memory-mapped parallel read differs from the reference in {key!r}"
    assert ref["report"]["errors"] == 1


def test_regex_path_alone_equals_reference(generated: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the compiled scanner (not built, or DIAGNOSER_NO_SCAN=1) the bulk regex path reads
    everything, with the same result."""
    from diagnoser.engines.sglang import logfast

    monkeypatch.setattr(logfast, "SCAN", None)
    ref = _assert_same(generated, 65536)
    assert ref["kinds"]["decode"] > 1000


def _sigterm_disposition(_: int) -> str:
    import signal

    return "default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "caught"


def test_workers_end_even_when_the_reader_catches_sigterm(generated: bytes) -> None:
    """A SIGTERM handler in the reading process (a library's, a test's) must not reach the forked
    workers: the pool ends them with SIGTERM, and a worker that survives it can hang the read for good
    (seen once in a full suite)."""
    import multiprocessing
    import signal

    from diagnoser.sources import logs as logsrc

    old = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with multiprocessing.get_context("fork").Pool(1, initializer=logsrc._worker_init) as pool:
            assert pool.apply(_sigterm_disposition, (0,)) == "default"
        _assert_same(generated, 65536, workers=2)
    finally:
        signal.signal(signal.SIGTERM, old)


_EARLY_TERM = r"""
import io, os, signal, sys, time
from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources import logs as logsrc
from diagnoser.sources.logs import open_log_reader
from diagnoser.timeline import Timeline

signal.signal(signal.SIGTERM, lambda *a: None)  # some library's handler in the reading process
real_init = logsrc._worker_init

def slow_init():  # the first worker starts at once and reads the whole small file; the other is still
    try:          # starting when the read is over and the pool is terminated
        os.mkdir(sys.argv[2] + "/" + str(os.getppid()))
    except FileExistsError:
        time.sleep(1.0)
    real_init()

logsrc._worker_init = slow_init
data = open(sys.argv[1], "rb").read()
for _ in range(3):
    rd = open_log_reader(ADAPTER, Timeline(target="t"), "server.log")
    rd.feed_stream(io.BytesIO(data), chunk=4096, bulk_min=0, workers=2)
print("done", rd.report.lines_recognized)
"""


def test_the_pool_ends_when_its_workers_are_still_starting(tmp_path: Path) -> None:
    """A small file is read before its workers have started. The pool's terminate() then signals workers
    that still carry the reading process's SIGTERM handler: each must still end (it once waited forever,
    and a whole test run hung on it)."""
    import subprocess
    import sys

    log = DATA / "sglang-cpu-real" / "kv-full-retract" / "server.log"
    r = subprocess.run([sys.executable, "-c", _EARLY_TERM, str(log), str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("done"), r.stderr


_WRAPPED = ("k8s_cri", "json_docker", "journald", "docker_compose", "ray", "tsv_export", "crlf", "ansi", "fork_rank_file",
            "python_asctime", "json_nested")


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "regex"])
@pytest.mark.parametrize("shape", _WRAPPED)
def test_bulk_equals_reference_on_wrapped_logs(generated: bytes, shape: str, scan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: a generated log and the real runs' logs wrapped as deployments wrap them
    (tests/test_log_prefixes.py): the bulk reader, which takes a collector's prefix off the lines it reads
    from SGLang's own prefix (logfast.unwrap_block), gives exactly the line parser's result; and where
    SGLang's prefix is still in the line, the bulk path takes the lines (the reference parser gets few)."""
    from diagnoser.engines.sglang import logfast
    from diagnoser.engines.sglang.logfast import BlockParser
    from diagnoser.engines.sglang.prefixshapes import SHAPES

    if not scan:
        monkeypatch.setattr(logfast, "SCAN", None)
    real = b"".join(p.read_bytes() for p in sorted(DATA.glob("sglang-cpu-real/*/server.log")))
    data = SHAPES[shape](generated[:150_000].rsplit(b"\n", 1)[0] + b"\n" + real)
    for chunk, workers in ((1 << 23, 0), (5555, 0)):
        _assert_same(data, chunk, workers)
    plain = generated[:150_000].rsplit(b"\n", 1)[0] + b"\n" + real
    taken = len(BlockParser().parse(data.rstrip(b"\n"))["bulk_rows"])
    if shape in ("k8s_cri", "json_docker", "journald", "docker_compose", "ray", "tsv_export", "crlf"):
        assert taken >= 0.99 * len(BlockParser().parse(plain.rstrip(b"\n"))["bulk_rows"]), shape
