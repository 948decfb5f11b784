"""Replay goes through the live ingestion path: a run directory or case folder gives exactly what
``--once --log`` / live scrapes give; ReplayFeed schedules records by (scaled) wall time."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

from diagnoser.bundle import BundleWriter, manifest, redact_fast
from diagnoser.cli import main as cli_main
from diagnoser.collect import collect_logs, finalize
from diagnoser.engines import get_adapter
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.redact import redact, redact_text
from diagnoser.replay import ReplayFeed, ReplayIngest, collect_replay, line_time, load_source
from diagnoser.sources.logs import read_log
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA


def _series(tl: Timeline) -> dict:
    return {k: (s.ts.tolist(), s.values.tolist(), s.sources.tolist()) for k, s in tl.series.items()}


def _cases() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(str(DATA / "cases" / "*")) if os.path.isfile(os.path.join(p, "server.log")))


def test_a_folder_with_only_a_saved_exposition_points_at_metrics_file() -> None:
    from diagnoser.bundle import BundleError

    folder = DATA / "cases" / "110-sglang-pr1461-early-metrics-idle-healthy"
    with pytest.raises(BundleError, match="use --metrics-file .*metrics.txt"):
        collect_replay(str(folder), get_adapter("sglang"))


@pytest.mark.parametrize("case", _cases() or ["(no data)"])
def test_a_case_folder_replays_exactly_like_once_log(case: str) -> None:
    folder = DATA / "cases" / case
    adapter = get_adapter("sglang")
    got = collect_replay(str(folder), adapter)
    want = collect_logs(adapter, [str(folder / "server.log")])
    assert len(got.timelines) == len(want.timelines) == 1
    g, w = got.timelines[0], want.timelines[0]
    assert g.target == w.target == str(folder / "server.log")
    assert _series(g) == _series(w)
    assert [(e.kind, e.ts, e.line_no, e.fields) for e in g.events] == [(e.kind, e.ts, e.line_no, e.fields) for e in w.events]
    assert {k: f.value for k, f in g.config.items()} == {k: f.value for k, f in w.config.items()}
    assert g.version == w.version and g.untimed == w.untimed
    assert [i.to_dict() for i in got.inputs if i.kind == "log"] == [i.to_dict() for i in want.inputs]


@pytest.mark.parametrize("run", ["kv-full-retract", "prefill-capped"])
def test_a_run_directory_replays_like_live_scrapes_plus_the_log(run: str, data_dir: Path) -> None:
    folder = data_dir / "sglang-cpu-real" / run
    adapter = get_adapter("sglang")
    got = collect_replay(str(folder), adapter).timelines[0]
    # the live path by hand: every scrape through MetricsTarget.ingest_text at its time, then the log
    tl = Timeline(target="x")
    vr = VersionRange()
    adapter.ingest_server_info(redact(json.loads((folder / "get_server_info.json").read_text())), tl, "get_server_info", vr)
    adapter.ingest_model_info(redact(json.loads((folder / "get_model_info.json").read_text())), tl, "get_model_info")
    mt = MetricsTarget("http://x", adapter)
    files = sorted(glob.glob(str(folder / "metrics" / "*.prom")))
    for f in files:
        ts = float(os.path.basename(f).rsplit("_", 1)[1].removesuffix(".prom"))
        assert mt.ingest_text(Path(f).read_text(), ts, tl)
    reader = read_log(adapter, tl, str(folder / "server.log"))
    vr.merge(mt.state.version)
    vr.merge(reader.parser.version)
    finalize(tl, vr)
    assert mt.report.scrapes == len(files) > 10
    metric_keys = {k for k in tl.series if any(src.startswith("scrape@") for src in tl.series[k].sources)}
    assert metric_keys
    g, w = _series(got), _series(tl)
    assert g.keys() == w.keys()
    for k in w:
        assert g[k][:2] == w[k][:2], k
    assert len(got.events) == len(tl.events)
    assert got.version == tl.version == "0.5.23"
    assert {k: f.value for k, f in got.config.items()} == {k: f.value for k, f in tl.config.items()}


def test_redact_fast_equals_redact_text_on_real_data_and_leaves_it_unchanged(data_dir: Path) -> None:
    files = sorted(glob.glob(str(data_dir / "sglang-cpu-real" / "*" / "metrics" / "*.prom")))[::7]
    files += sorted(glob.glob(str(data_dir / "sglang" / "metrics" / "*.prom")))
    assert len(files) > 10
    for f in files:
        text = Path(f).read_text(errors="replace")
        assert redact_fast(text) == text == "".join(redact_text(ln) for ln in text.splitlines(keepends=True)), f
    for f in glob.glob(str(data_dir / "sglang" / "logs" / "*")) + glob.glob(str(data_dir / "cases" / "*" / "server.log")):
        for ln in Path(f).read_text(errors="replace").splitlines():
            if "server_args=" in ln or "ServerArgs(" in ln:
                continue  # dict-repr lines are where redact_fast adds the quoted-key rule
            assert redact_fast(ln) == redact_text(ln), ln


@pytest.mark.parametrize(
    "line, secret",
    [
        ("[2026-11-29 10:00:00] server_args={'model_path': 'm', 'api_key': 'sk-live-123', 'port': 30000}", "sk-live-123"),
        ("[2026-11-29 10:00:00] server_args=ServerArgs(model_path='m', api_key='sk-live-123', port=30000)", "sk-live-123"),
        ("python -m sglang.launch_server --api-key sk-live-123 --port 30000", "sk-live-123"),
        ('sglang:x{url="http://user:pw-123@host:1/"} 1.0', "pw-123"),
        ("[x] 'hf_token': \"hf_abcdef\", 'admin_api_key': 'adm-9'", "hf_abcdef"),
    ],
)
def test_redact_fast_removes_secrets(line: str, secret: str) -> None:
    out = redact_fast(line)
    assert secret not in out and "***" in out


def test_line_time_reads_sglang_stamps() -> None:
    assert line_time("[2026-11-29 09:31:57] Decode batch") == 1795944717.0
    assert line_time("[2026-11-29 09:31:57.250 DP1 TP0] x") == pytest.approx(1795944717.25)
    assert line_time("no stamp here") is None


def _feed_bundle(path: Path) -> None:
    w = BundleWriter(str(path), fsync=False)
    w.write_member([manifest([{"name": "t", "url": "t"}], [], 100.0, 2.0, 10.0),
                    {"kind": "config", "t": 100.0, "target": "t", "path": "/server_info", "data": {"version": "0.5.23"}}])
    for i in range(5):
        w.write_member([{"kind": "scrape", "t": 100.0 + 2 * i, "target": "t", "text": f"sglang:num_running_reqs {i}\n"},
                        {"kind": "log", "t": 101.0 + 2 * i, "target": "t", "source": "s.log", "first_line": i + 1, "lines": [f"line {i}"]}])
    w.write_member([{"kind": "end", "t": 110.0, "reason": "duration"}], final=True)
    w.close()


def test_replay_feed_releases_records_by_scaled_wall_time(tmp_path: Path) -> None:
    p = tmp_path / "f.dgb"
    _feed_bundle(p)
    feed = ReplayFeed(str(p), speed=2.0)
    feed.start(now=1000.0)
    first = feed.due(1000.0)
    assert [r["kind"] for r in first] == ["config", "scrape"]
    assert [r["kind"] for r in feed.due(1000.49)] == []
    assert [r["t"] for r in feed.due(1000.5)] == [101.0]  # recorded +1 s at speed 2 = wall +0.5 s
    rest = feed.due(1010.0)
    assert [r["t"] for r in rest] == [102.0, 103.0, 104.0, 105.0, 106.0, 107.0, 108.0, 109.0]
    assert feed.finished and feed.due(2000.0) == []


def test_replay_feed_loops_forward_in_time_and_sends_config_once(tmp_path: Path) -> None:
    p = tmp_path / "f.dgb"
    _feed_bundle(p)
    feed = ReplayFeed(str(p), speed=1.0, loop=True)
    feed.start(now=0.0)
    assert feed.period == pytest.approx(9.0 + 2.0)  # span + one scrape interval
    recs = feed.due(25.0)
    scr = [r["t"] for r in recs if r["kind"] == "scrape"]
    assert scr == [100, 102, 104, 106, 108, 111, 113, 115, 117, 119, 122, 124]
    assert sum(r["kind"] == "config" for r in recs) == 1
    assert {r.get("pass", 0) for r in recs} == {0, 1, 2}
    assert not feed.finished and feed.position(25.0) == (2, pytest.approx(3.0))


def test_replay_ingest_grows_with_the_feed(tmp_path: Path) -> None:
    p = tmp_path / "f.dgb"
    _feed_bundle(p)
    feed = ReplayFeed(str(p), speed=1.0)
    ing = ReplayIngest(get_adapter("sglang"), feed.source)
    feed.start(now=0.0)
    for r in feed.due(4.5):
        ing.apply(r)
    col = ing.collection()
    assert col.timelines[0].get("running_reqs").values.tolist() == [0.0, 1.0, 2.0]
    assert col.timelines[0].version == "0.5.23"
    for r in feed.due(100.0):
        ing.apply(r)
    col = ing.collection()
    assert col.timelines[0].get("running_reqs").values.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_once_replay_bad_inputs_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--once", "--replay", str(tmp_path / "missing.dgb")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err
    (tmp_path / "notgz").write_text("hello\n")
    assert cli_main(["--once", "--replay", str(tmp_path / "notgz")]) == 2
    assert "not a diagnoser bundle" in capsys.readouterr().err
    empty = tmp_path / "emptydir"
    empty.mkdir()
    assert cli_main(["--once", "--replay", str(empty)]) == 2
    assert "neither server.log nor metrics" in capsys.readouterr().err


def test_directory_sources_are_time_ordered_and_redacted(data_dir: Path) -> None:
    src = load_source(str(data_dir / "sglang-cpu-real" / "kv-full-retract"))
    ts = [r["t"] for r in src.records]
    assert ts == sorted(ts)
    assert src.records[0]["kind"] == "config" or src.records[0]["t"] <= src.scrape_times()[0]
    assert len(src.scrape_times()) == 20
    assert src.manifest["sglang_version"] == "0.5.23"
    joined = "\n".join(str(x) for r in src.records if r["kind"] == "log" for x in r["lines"])
    assert "'watermark_key': '***'" in joined  # redacted even though the server printed '<redacted>'
