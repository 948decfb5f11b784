"""Every parser path is total: impossible values in real expositions, impossible log stamps, bundle
manifests and records of the wrong type, and odd dashboard URLs give a counted input problem (or a
404), never a traceback. All cases start from REAL data (tests/data) with one thing broken."""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.evaluate import evaluate
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA, ROOT
from tests.helpers import read_log_bytes

RUN = DATA / "sglang-cpu-real" / "kv-full-retract"
SCRAPES = sorted((RUN / "metrics").glob("*.prom"))[3:6]


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    return lambda text: re.sub(pattern, repl, text)


MUTATIONS = {
    'le="abc"': _sub(r'le="0\.1"', 'le="abc"'),
    'le=""': _sub(r'le="0\.1"', 'le=""'),
    "400-digit gauge": _sub(r"(sglang:num_running_reqs\{[^}]*\}) \S+", r"\g<1> " + "9" * 400),
    "400-digit pool size": _sub(r"(sglang:max_total_num_tokens\{[^}]*\}) \S+", r"\g<1> " + "9" * 400),
    "400-digit counter": _sub(r"(sglang:prompt_tokens_total\{[^}]*\}) \S+", r"\g<1> " + "7" * 400),
    "NaN running": _sub(r"(sglang:num_running_reqs\{[^}]*\}) \S+", r"\g<1> NaN"),
    "negative queue": _sub(r"(sglang:num_queue_reqs\{[^}]*\}) \S+", r"\g<1> -3"),
    "+Inf usage": _sub(r"(sglang:token_usage\{[^}]*\}) \S+", r"\g<1> +Inf"),
    "-Inf counter": _sub(r"(sglang:num_requests_total\{[^}]*\}) \S+", r"\g<1> -Inf"),
    "NaN bucket count": _sub(r'(sglang:time_to_first_token_seconds_bucket\{[^}]*le="1\.0"[^}]*\}) \S+', r"\g<1> NaN"),
}


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "prometheus_client path"])
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_impossible_sample_values_are_counted_dropped_and_reported(name: str, fast: bool) -> None:
    mutate = MUTATIONS[name]
    texts = [p.read_text() for p in SCRAPES]
    assert all(mutate(t) != t for t in texts), "the mutation must hit the real exposition"
    mt = MetricsTarget("http://127.0.0.1:1", ADAPTER)
    tl = Timeline(target="t")
    for i, t in enumerate(texts):
        assert mt.ingest_text(mutate(t), 1000.0 + 2 * i, tl, fast=fast), mt.last_error
    finalize(tl, mt.state.version)
    report = evaluate([tl], ADAPTER, {}, None, {})
    assert report.errors == [], report.errors  # the rule pass met only possible values
    assert mt.report.errors >= len(texts)  # counted, once per dropped sample
    assert any("impossible values" in m for m in mt.report.messages), mt.report.messages
    for s in tl.series.values():  # dropped: no signal holds a NaN, an infinity or a negative count
        v = s.values
        assert all(math.isfinite(x) and x >= 0 for x in v.tolist()), s
    assert sum(1 for (_n, rank) in tl.series if not rank) >= 8  # the rest of each scrape was used
    mtt = tl.config.get("max_total_tokens")
    assert mtt is None or math.isfinite(float(mtt.value))


def test_impossible_values_are_an_input_problem_in_the_report(tmp_path: Path) -> None:
    """End to end: a run directory whose scrapes carry impossible values replays with exit 1 (the real
    findings), a strict JSON report, and the dropped samples counted as input errors."""
    mdir = tmp_path / "metrics"
    mdir.mkdir()
    for p in sorted((RUN / "metrics").glob("*.prom"))[2:12]:
        (mdir / p.name).write_text(MUTATIONS["NaN running"](MUTATIONS['le="abc"'](p.read_text())))
    r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", "--replay", str(tmp_path), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    metrics = next(i for i in doc["inputs"] if i["kind"] == "metrics")
    assert metrics["errors"] >= 10 and any("impossible values" in m for m in metrics["messages"])


# -- log stamps ------------------------------------------------------------------------------------------

def _real_decode_line() -> str:
    for ln in (RUN / "server.log").read_text().splitlines():
        if "Decode batch" in ln and ln.startswith("[20"):
            return ln
    raise AssertionError("no decode line in the real log")


BAD_STAMPS = ["0000-00-00 00:00:00", "9999-12-31 23:59:59", "2025-02-29 10:00:00", "2026-04-31 10:00:00",
              "2026-13-01 10:00:00", "2026-11-29 24:00:00", "2026-11-29 10:60:00", "2026-11-29 10:00:60", "1969-12-31 23:59:59"]


def _read(data: bytes, mode: str) -> tuple[Any, Timeline]:
    return read_log_bytes(data, "server.log", {"line parser": "line", "bulk, C scanner": "scan", "bulk, regex path": "regex"}[mode])


def test_out_of_range_stamps_are_errors_on_their_line_in_every_reading_path() -> None:
    good = _real_decode_line()
    body = good[good.index("]") + 1:]
    lines = [good]
    for s in BAD_STAMPS:
        lines += [f"[{s}]{body}", f"[{s} DP0 TP0]{body}", f"[{s}.250]{body}"]
    lines += [f"[99:99:99 TP0]{body}", f"[24:00:00]{body}", good]
    data = ("\n".join(lines * 300) + "\n").encode()
    results = {}
    for mode in ("line parser", "bulk, C scanner", "bulk, regex path"):
        r, tl = _read(data, mode)
        s = tl.get("running_reqs")
        results[mode] = (r.report.lines_read, r.report.lines_recognized, r.report.errors, r.bad_stamps, s.ts.tolist(), s.values.tolist())
        assert r.report.errors == r.bad_stamps == (len(lines) - 2) * 300
        assert r.report.lines_recognized == 2 * 300
        assert any("timestamp no calendar has" in m for m in r.report.messages)
    assert results["line parser"] == results["bulk, C scanner"] == results["bulk, regex path"]


@pytest.mark.parametrize("stamp", ["0000-00-00 00:00:00", "9999-12-31 23:59:59"])
def test_diagnose_once_on_out_of_range_stamps_says_so(tmp_path: Path, stamp: str) -> None:
    good = _real_decode_line()
    log = tmp_path / "server.log"
    log.write_text(f"[{stamp}]{good[good.index(']') + 1:]}\n" * 3 + good + "\n")
    for fmt in ("text", "json"):
        r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", "--log", str(log), "--format", fmt],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        out = r.stdout + r.stderr
        assert "timestamp no calendar has" in out


# -- bundles of the wrong shape --------------------------------------------------------------------------

def _bundle(path: Path, records: list[dict[str, Any]]) -> Path:
    with open(path, "wb") as f:
        for rec in records:
            f.write(gzip.compress((json.dumps({"v": 1, **rec}) + "\n").encode()))
    return path


def _good_scrape(t: float) -> dict[str, Any]:
    return {"kind": "scrape", "t": t, "target": "http://10.0.0.1:30000", "text": SCRAPES[0].read_text(), "status": 200}


WRONG = {
    '"targets": "x"': [{"kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": "x", "logs": []}],
    '"logs": 5, "window": "w"': [{"kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": [], "logs": 5,
                                  "window": "w", "interval_s": "fast"}],
    '"t": "abc"': [{"kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": [], "logs": []},
                   {"kind": "scrape", "t": "abc", "target": "http://10.0.0.1:30000", "text": "x"}],
    "wrong field types": [{"kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": [{"name": 5}], "logs": []},
                          {"kind": "scrape", "t": 1e300, "target": "x", "text": "x"}, {"kind": "scrape", "t": 100.0, "target": ["x"], "text": "x"},
                          {"kind": "scrape", "t": 100.0, "target": "x", "text": 5}, {"kind": "log", "t": 100.0, "target": "x", "lines": "abc"},
                          {"kind": "log", "t": 100.0, "target": "x", "lines": [1, None]}, {"kind": "config", "t": 100.0, "path": 3, "data": [1]},
                          {"kind": "scrape", "t": True, "target": "x", "text": "x"}, {"kind": "scrape", "t": float("nan"), "target": "x", "text": "x"},
                          {"kind": "scrape", "t": 100.0, "target": "x", "error": {"e": 1}}, {"kind": "note", "t": 100.0, "text": ["x"]}],
}


@pytest.mark.parametrize("name", list(WRONG))
def test_bundles_with_fields_of_the_wrong_type_replay_what_is_readable(tmp_path: Path, name: str) -> None:
    bundle = _bundle(tmp_path / "b.dgb", WRONG[name] + [_good_scrape(1_795_944_700.0 + i) for i in range(3)])
    for args in (["--once", "--replay", str(bundle), "--format", "json"], ["--once", "--replay", str(bundle)]):
        r = subprocess.run([sys.executable, "-m", "diagnoser", *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        assert "damaged" in r.stdout + r.stderr or "ignored" in r.stdout + r.stderr
    from diagnoser.replay import collect_replay, load_source

    src = load_source(str(bundle))
    assert src.problems and sum(1 for r in src.records if r["kind"] == "scrape") == 3
    assert all(isinstance(r["t"], float) for r in src.records) and all(isinstance(t, str) for t in src.targets)
    col = collect_replay(str(bundle), ADAPTER)
    assert col.usable() and any(tl.get("running_reqs") for tl in col.timelines)


def test_replay_server_and_serve_take_such_bundles_too(tmp_path: Path) -> None:
    from diagnoser.cli.replay_server import ReplayState
    from diagnoser.live import ReplayMonitor
    from diagnoser.replay import ReplayFeed, load_source

    bundle = _bundle(tmp_path / "b.dgb", WRONG["wrong field types"] + WRONG['"t": "abc"'][1:] + [_good_scrape(1_795_944_700.0 + i) for i in range(3)])
    src = load_source(str(bundle))
    state = ReplayState(src, speed=1000.0)
    assert state.scrape_at() is not None
    mon = ReplayMonitor(ReplayFeed(src, speed=1000.0), ADAPTER, interval=1.0, for_seconds=0)
    snap = mon.tick()
    mon.close()
    assert snap.targets and not snap.errors


# -- the dashboard's URLs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_stamp_monitor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A log-only target whose log holds out-of-range stamps and good lines (what made /target/N a 500)."""
    from diagnoser.live import LiveMonitor

    good = _real_decode_line()
    body = good[good.index("]") + 1:]
    log = tmp_path_factory.mktemp("stamps") / "server.log"
    # a good line, the last second a calendar has, then a line without a stamp (read one second later)
    log.write_text("".join(f"[{s}]{body}\n" for s in BAD_STAMPS) + good + "\n" + f"[9999-12-31 23:59:59]{body}\n" + body.strip() + "\n")
    m = LiveMonitor(ADAPTER, [], [str(log)], interval=0.5, for_seconds=0)
    m.tick()
    yield m
    m.close()


def test_target_pages_answer_for_logs_with_bad_stamps(bad_stamp_monitor: Any) -> None:
    from fastapi.testclient import TestClient

    from diagnoser.web import create_app

    c = TestClient(create_app(bad_stamp_monitor), raise_server_exceptions=False)
    for p in ("/", "/index.json", "/target/0", "/target/0.json", "/_/target/0", "/target/0/series.json?range=24h", "/metrics", "/_/cards"):
        r = c.get(p)
        assert r.status_code == 200, (p, r.status_code, r.text[:200])
    doc = json.loads(c.get("/target/0.json").text)
    assert doc["window"]["end"] is not None and doc["signals"]["running_reqs"] >= 0  # the good line was read


@pytest.mark.parametrize("path", ["/target/\u00b2", "/target/\u00b2.json", "/target/" + "9" * 5000, "/target/" + "9" * 5000 + ".json",
                                  "/target/\u0661", "/target/-1", "/target/1e3", "/_/target/\u00b2", "/_/target/" + "7" * 5000,
                                  "/target/\u00b2/series.json", "/target/" + "8" * 5000 + "/series.json",
                                  "/target/0/series.json?points=" + "9" * 5000, "/target/0/series.json?range=%00"])
def test_odd_target_urls_are_404_or_400_never_500(bad_stamp_monitor: Any, path: str) -> None:
    from urllib.parse import quote

    from fastapi.testclient import TestClient

    from diagnoser.web import create_app

    c = TestClient(create_app(bad_stamp_monitor), raise_server_exceptions=False)
    r = c.get(quote(path, safe="/?=&%"))  # as a browser sends it (percent-encoded UTF-8)
    assert r.status_code in (400, 404, 422), (path[:60], r.status_code, r.text[:200])
    assert "Traceback" not in r.text


@pytest.mark.parametrize("header", ["Bearer t\u00f6ken", "Bearer \u6a21\u578b", "Bearer \udcff", "b\u00e4d"])
def test_a_non_ascii_token_is_just_a_wrong_token(bad_stamp_monitor: Any, header: str) -> None:
    from fastapi.testclient import TestClient

    from diagnoser.web import create_app

    c = TestClient(create_app(bad_stamp_monitor, token="right-token"), raise_server_exceptions=False)
    raw = header.encode("utf-8", "surrogateescape")
    r = c.get("/", headers=[(b"authorization", raw)])
    assert r.status_code == 401
    assert c.get("/?token=" + "t\u00f6ken").status_code == 401
    assert c.get("/", headers=[(b"cookie", b"diagnoser_token=t\xc3\xb6ken")]).status_code == 401
    assert c.get("/", headers={"Authorization": "Bearer right-token"}).status_code == 200
