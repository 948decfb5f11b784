"""A log read to the window it judges (diagnoser/timeline/window.py) holds exactly what the whole log
cut at the window's start holds (``Timeline.window``): the same points, events, config and version;
what it dropped is counted exactly; the rules, the advice and the report on it are those on the cut
whole log. Proven on real logs (cut into small chunks so that they span many) and on generated logs
mixing every common and rare shape, in one process and with workers, with a point budget and with
``--last``; the CLI says what it judged.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from diagnoser.collect import LogOptions, collect_logs, finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources import logs as logsrc
from diagnoser.sources.logs import LogReader, finish_report, open_log_reader
from diagnoser.timeline import Timeline
from diagnoser.timeline.window import WHOLE_LOG_EVENTS, LogWindow, duration_text
from tests.conftest import DATA, ROOT


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("bench_log_backfill", ROOT / "bench" / "bench_log_backfill.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gen") / "server.log"
    _generator().generate(path, 2.0, seed=5)
    return path.read_bytes()


def _read(data: bytes, chunk: int, workers: int = 0, max_points: int | None = None,
          last_s: float | None = None) -> tuple[Timeline, LogReader, LogWindow | None, list[int]]:
    """Read as ``read_log_into`` does (observer after each chunk and once at the end, then the parser's
    end-of-log summary, then the keeper's last trim), with small chunks."""
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    keeper = LogWindow(tl, max_points, last_s) if max_points is not None or last_s is not None else None
    per_chunk: list[int] = []  # points each chunk added (counted without a keeper)
    held = [0]

    def count(reader: LogReader) -> None:
        n = sum(len(s) for s in tl.series.values())
        per_chunk.append(n - held[0])
        held[0] = n

    rd.observer = keeper.observe if keeper is not None else count
    rd.feed_stream(io.BytesIO(data), chunk=chunk, bulk_min=0, workers=workers)
    rd.observer(rd)
    finish_report(ADAPTER, rd)
    if keeper is not None:
        keeper.finish()
    return tl, rd, keeper, per_chunk


def _series(tl: Timeline) -> dict[Any, Any]:
    return {k: (s.ts.tolist(), s.values.tolist(), s.sources.tolist()) for k, s in sorted(tl.series.items()) if len(s)}


def _events(tl: Timeline) -> list[Any]:
    return [(e.kind, e.ts, e.line_no, e.source, e.fields, e.rank) for e in tl.events if e.kind not in WHOLE_LOG_EVENTS]


def _assert_window_is_the_cut_log(full: Timeline, full_rd: LogReader, tl: Timeline, rd: LogReader, keeper: LogWindow) -> None:
    cut = keeper.cut
    ref = full.window(cut, None)
    assert _series(tl) == _series(ref)
    assert _events(tl) == _events(ref)
    # the whole-log summary event stays whatever its time
    assert [e.fields for e in tl.events if e.kind in WHOLE_LOG_EVENTS] == [e.fields for e in full.events if e.kind in WHOLE_LOG_EVENTS]
    assert {k: (f.value, f.source) for k, f in tl.config.items()} == {k: (f.value, f.source) for k, f in full.config.items()}
    p, q = rd.parser.version, full_rd.parser.version
    assert (p.low, p.high, p.exact, p.reasons) == (q.low, q.high, q.exact, q.reasons)
    assert rd.report.to_dict() == full_rd.report.to_dict()
    # what was dropped is counted exactly
    b = keeper.before
    older = {k: s.values[s.ts < cut] for k, s in full.series.items()}
    assert b.points == sum(len(v) for v in older.values())
    for key, v in older.items():
        v = v[~np.isnan(v)]
        if not len(v):
            assert key not in b.signals
            continue
        n, lo, hi, total = b.signals[key]
        assert (n, lo, hi) == (len(v), float(v.min()), float(v.max()))
        assert total == pytest.approx(float(v.sum()), rel=1e-12)
    assert b.events == Counter(e.kind for e in full.events if e.ts < cut and e.kind not in WHOLE_LOG_EVENTS)
    if b.points:
        assert b.start == min(float(s.ts[0]) for s in full.series.values() if len(s) and s.ts[0] < cut) or b.events
        assert b.end == cut


@pytest.mark.parametrize("chunk", [65536, 7000])
@pytest.mark.parametrize("share", [0.5, 0.1])
def test_budget_window_is_the_whole_log_cut_at_its_start(generated: bytes, chunk: int, share: float) -> None:
    full, full_rd, _, per_chunk = _read(generated, chunk)
    total = sum(len(s) for s in full.series.values())
    budget = int(total * share)
    tl, rd, keeper, _ = _read(generated, chunk, max_points=budget)
    assert keeper is not None and keeper.trimmed
    _assert_window_is_the_cut_log(full, full_rd, tl, rd, keeper)
    held = sum(len(s) for s in tl.series.values())
    # the newest chunks that fit the budget: at most the budget, and one chunk more would not fit (less
    # the points of the first chunk kept stamped no later than the chunk before it)
    assert held <= budget
    assert held > budget - 2 * max(per_chunk)
    assert len(tl.events_of("retraction")) < len(full.events_of("retraction"))


def test_budget_window_is_the_same_with_worker_processes(generated: bytes) -> None:
    one, *_ = _read(generated, 20000, max_points=30000)
    two, *_ = _read(generated, 20000, workers=2, max_points=30000)
    assert _series(one) == _series(two) and _events(one) == _events(two)


def test_a_budget_larger_than_the_log_keeps_everything(generated: bytes) -> None:
    full, *_ = _read(generated, 65536)
    tl, _, keeper, _ = _read(generated, 65536, max_points=10**9)
    assert keeper is not None and not keeper.trimmed and keeper.summary()["before"] is None
    assert keeper.message("server.log") is None
    assert _series(tl) == _series(full) and _events(tl) == _events(full)


def test_one_chunk_over_the_budget_is_kept_whole(generated: bytes) -> None:
    """The window never goes below the newest chunk: a budget smaller than one chunk keeps that chunk."""
    full, full_rd, _, per_chunk = _read(generated, 65536)
    tl, rd, keeper, _ = _read(generated, 65536, max_points=10)
    assert keeper is not None and keeper.trimmed
    _assert_window_is_the_cut_log(full, full_rd, tl, rd, keeper)
    assert 0 < sum(len(s) for s in tl.series.values()) <= max(per_chunk)


@pytest.mark.parametrize("last_s", [5.0, 40.0])
def test_last_window_is_the_last_seconds(generated: bytes, last_s: float) -> None:
    full, full_rd, _, _ = _read(generated, 30000)
    tl, rd, keeper, _ = _read(generated, 30000, last_s=last_s)
    assert keeper is not None and keeper.trimmed
    end = max(float(s.ts[-1]) for s in full.series.values() if len(s))
    assert keeper.cut == end - last_s  # as --last cuts: Timeline.window(end - last, end)
    _assert_window_is_the_cut_log(full, full_rd, tl, rd, keeper)
    assert keeper.message("server.log").startswith(f"Judged the last {duration_text(last_s)} of server.log, as --last asks")


def _real(name: str) -> bytes:
    return (DATA / "sglang-cpu-real" / name / "server.log").read_bytes()


@pytest.mark.parametrize("run", ["prefill-capped", "kv-full-retract", "long-queue"])
def test_window_on_real_engine_logs(data_dir: Path, run: str) -> None:
    """Real SGLang 0.5.23 logs, read in 8 KB chunks with a budget of a third of their points."""
    data = _real(run)
    full, full_rd, _, _ = _read(data, 8192)
    total = sum(len(s) for s in full.series.values())
    tl, rd, keeper, _ = _read(data, 8192, max_points=total // 3)
    assert keeper is not None and keeper.trimmed
    _assert_window_is_the_cut_log(full, full_rd, tl, rd, keeper)
    assert 0 < sum(len(s) for s in tl.series.values()) <= total // 3


def _doc(col: Any) -> dict[str, Any]:
    from diagnoser.advice import enrich
    from diagnoser.evaluate import evaluate
    from diagnoser.outputs.report import build

    report = evaluate(col.timelines, ADAPTER, {}, None, {})
    enrich(report, col.timelines, {})
    return build(col, report)


@pytest.mark.parametrize("run", ["kv-full-retract", "long-queue"])
def test_rules_on_the_window_are_the_rules_on_the_cut_log(data_dir: Path, tmp_path: Path, run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings, suggestions, signal tables and window of a budget-windowed read are those of the whole
    log cut at the window's start (real engine logs, read through collect_logs in 16 KB chunks)."""
    path = tmp_path / "server.log"
    path.write_bytes(_real(run))
    monkeypatch.setattr(logsrc, "CHUNK", 16384)
    monkeypatch.setattr(logsrc.LogReader.feed_stream, "__defaults__", (None, 0, None))  # the bulk path for a small log
    whole = collect_logs(ADAPTER, [str(path)])
    total = sum(len(s) for s in whole.timelines[0].series.values())
    col = collect_logs(ADAPTER, [str(path)], options=LogOptions(max_points=total // 2))
    win = col.inputs[0].window
    assert win is not None and win["before"]["points"] > 0 and win["points"] <= total // 2

    # the reference: the whole log read without a window, cut at the same start, then finalised
    ref_tl = Timeline(target=str(path))
    rd = logsrc.read_log(ADAPTER, ref_tl, str(path))
    keeper_cut = win["cut"]
    cut = ref_tl.window(keeper_cut, None)
    cut.events.extend(e for e in ref_tl.events if e.kind in WHOLE_LOG_EVENTS and e.ts < keeper_cut)
    cut.events.sort(key=lambda e: (e.ts, e.line_no))
    col.timelines[0].events.sort(key=lambda e: (e.ts, e.line_no))
    cut.inputs = [rd.report]
    cut.meta["log_window"] = col.timelines[0].meta["log_window"]  # what was counted before it (KV02 notes it)
    finalize(cut, rd.parser.version)
    whole.timelines[0] = cut
    whole.inputs = [rd.report]

    got, ref = _doc(col), _doc(whole)
    assert got["findings"] == ref["findings"] and got["signals"] == ref["signals"] and got["window"] == ref["window"]
    assert got["findings"], "the real run shows its bottleneck in the window too"
    msgs = got["inputs"][0]["messages"]
    assert msgs[0].startswith(f"Judged the newest {duration_text(_parse_iso(win['end']) - _parse_iso(win['start']))} of {path}")
    assert "are counted, not judged" in msgs[0] and "Pass --last" in msgs[0]


def _parse_iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_cli_last_keeps_only_that_window_and_says_so(tmp_path: Path, generated: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli.run import main

    path = tmp_path / "server.log"
    path.write_bytes(generated)
    code = main(["--once", "--log", str(path), "--last", "30s", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    inp = doc["inputs"][0]
    assert inp["window"]["judged"] == "last" and inp["window"]["last_seconds"] == 30
    assert inp["window"]["before"]["points"] > 0 and inp["window"]["before"]["events"]["retraction"] > 0
    assert inp["messages"][0].startswith(f"Judged the last 30 s of {path}, as --last asks")
    start, end = _parse_iso(doc["window"]["start"]), _parse_iso(doc["window"]["end"])
    assert 0 < end - start <= 30


def test_cli_default_budget_judges_the_newest_points(tmp_path: Path, generated: bytes, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The default window: the newest MAX_POINTS points (made small here, with small chunks)."""
    from diagnoser.cli.run import main
    from diagnoser.timeline import window

    path = tmp_path / "server.log"
    path.write_bytes(generated)
    monkeypatch.setattr(logsrc, "CHUNK", 65536)
    monkeypatch.setattr(window, "MAX_POINTS", 20000)
    main(["--once", "--log", str(path), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    inp = doc["inputs"][0]
    assert inp["window"]["judged"] == "newest" and inp["window"]["max_points"] == 20000
    assert 0 < inp["window"]["points"] <= 20000 and inp["window"]["first_line"] > 1
    assert inp["lines_read"] == generated.count(b"\n")
    # the retraction rule says what it left out (the whole run's count is an aggregate, not judged)
    kv = next(f for f in doc["findings"] if f["rule"] == "kv_retraction")
    before = inp["window"]["before"]["events"]["retraction"]
    assert any(n.startswith(f"Only the log's newest part is judged: the {before:,} retraction event(s)") for n in kv["notes"])
    monkeypatch.setattr(window, "MAX_POINTS", 10**9)
    main(["--once", "--log", str(path), "--format", "json"])
    whole = json.loads(capsys.readouterr().out)
    assert "window" not in whole["inputs"][0]
    kv = next(f for f in whole["findings"] if f["rule"] == "kv_retraction")
    assert not any(n.startswith("Only the log's newest part") for n in kv.get("notes", []))
    assert not any(m.startswith("Judged") for m in whole["inputs"][0].get("messages", []))
    assert _parse_iso(doc["window"]["start"]) > _parse_iso(whole["window"]["start"])
    assert doc["window"]["end"] == whole["window"]["end"]


def test_every_real_log_is_judged_whole_by_default(data_dir: Path) -> None:
    """The default budget is far above every real log: each is judged whole, as before."""
    from diagnoser.timeline.window import MAX_POINTS

    paths = sorted(DATA.glob("sglang-cpu-real/*/server.log")) + sorted(DATA.glob("cases/*/server.log"))
    for path in paths:
        col = collect_logs(ADAPTER, [str(path)], options=LogOptions(max_points=MAX_POINTS))
        whole = collect_logs(ADAPTER, [str(path)])
        assert col.inputs[0].window is None
        assert _series(col.timelines[0]) == _series(whole.timelines[0])


def test_untimed_lines_are_windowed_by_line_order() -> None:
    """Lines pasted without timestamps are one second apart in line order: the window still applies."""
    line = b"Decode batch, #running-req: 7, #token: 900, token usage: 0.10, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0\n"
    data = line * 20000
    full, full_rd, _, _ = _read(data, 50000)
    tl, rd, keeper, _ = _read(data, 50000, max_points=30000)
    assert keeper is not None and keeper.trimmed
    _assert_window_is_the_cut_log(full, full_rd, tl, rd, keeper)
    assert rd.parser.untimed_lines == 20000


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0, 45, 600, 3 * 3600 + 720, 3 * 86400)] == ["0 s", "45 s", "10 min", "3.2 h", "3.0 d"]


def test_an_access_summary_older_than_the_window_leaves_the_window_alone() -> None:
    """Access lines that stopped before the window: their whole-log summary event would stretch the
    window's span back to them, so it goes (the input report's message keeps the counts)."""
    access = b'[2026-11-29 09:00:%02d] INFO:     10.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK\n'
    decode = b"[2026-11-29 %02d:%02d:%02d] Decode batch, #running-req: 7, #token: 900, token usage: 0.10, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0\n"
    data = b"".join(access % s for s in range(50))
    data += b"".join(decode % (10 + i // 3600, i // 60 % 60, i % 60) for i in range(20000))
    tl, rd, keeper, _ = _read(data, 60000, max_points=40000)
    assert keeper is not None and keeper.trimmed
    assert not tl.events_of("access_summary")
    start, end = tl.span()
    assert start is not None and start >= keeper.cut
    assert any(m.startswith("Access log: 50 request(s)") for m in rd.report.messages)


def test_stdin_is_windowed_like_a_file(tmp_path: Path, generated: bytes) -> None:
    """``--log -``: the same window as the file gives (no memory map, no workers: chunks come from a pipe)."""
    from diagnoser.collect import read_log_into

    path = tmp_path / "server.log"
    path.write_bytes(generated)
    opts = LogOptions(last_s=20.0)
    a, b = Timeline(target="f"), Timeline(target="s")
    rf = read_log_into(ADAPTER, a, str(path), options=opts)
    rs = read_log_into(ADAPTER, b, "-", stdin=io.BytesIO(generated), options=opts)
    def strip(tl: Timeline) -> Any:  # the sources name the file or stdin
        return ({k: v[:2] for k, v in _series(tl).items()}, [(e[0], e[1], e[2], e[4]) for e in _events(tl)])

    assert strip(a) == strip(b)
    assert rf.report.window is not None and rs.report.window is not None
    assert rs.report.messages[0].startswith("Judged the last 20 s of stdin, as --last asks")


def _rss_file_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return -1


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_reading_a_file_leaves_none_of_it_resident(tmp_path: Path, generated: bytes) -> None:
    """The bulk reader maps the file to find its chunks' ends and reads the chunks with pread: what the
    searches touched is released chunk by chunk, so the pages of the file mapped in the reading process
    stay a small constant while it reads (they grew with the file, by about a quarter of it, before)."""
    path = tmp_path / "server.log"
    path.write_bytes(generated * 25)  # 50 MB, 200 chunks of 256 KB
    before = _rss_file_kb()
    peak = [0]
    tl = Timeline(target="t")
    with open(path, "rb") as fh:
        rd = open_log_reader(ADAPTER, tl, "server.log")
        rd.observer = lambda r: peak.__setitem__(0, max(peak[0], _rss_file_kb() - before))
        rd.feed_stream(fh, chunk=1 << 18, workers=0)
    assert rd.report.lines_read == generated.count(b"\n") * 25
    assert peak[0] < 6 * 1024, f"{peak[0]} KB of the log stayed mapped while it was read"


def test_cli_metrics_file_with_a_log_keeps_the_log_to_its_window(tmp_path: Path, generated: bytes, data_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--metrics-file`` with ``--log``: the log is kept to the window there too."""
    from diagnoser.cli.run import main

    path = tmp_path / "server.log"
    path.write_bytes(generated)
    expo = sorted(DATA.glob("sglang-cpu-real/kv-full-retract/metrics/*.prom"))[0]
    main(["--once", "--metrics-file", str(expo), "--log", str(path), "--last", "30s", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    log = next(i for i in doc["inputs"] if i["kind"] == "log")
    assert log["window"]["judged"] == "last" and log["window"]["before"]["points"] > 0
