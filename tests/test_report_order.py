"""One order of the findings, decided once (evaluate.cause_order): the top cause, then what it explains,
then the rest by severity. Every surface shows it: the text report, its JSON (findings[0] is the top
cause), watch, the overview card, the target page and the exporter. Input: the bundled recording of a
real SGLang 0.5.23 run (examples/kv-full-retract.dgb), where kv_retraction (KV02) sorted before
kv_saturation (KV01) by severity-then-name although the top cause is kv_saturation."""

from __future__ import annotations

import io
import json
import re
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.engines.sglang import ADAPTER
from diagnoser.evaluate import cause_order, explains
from diagnoser.model import Finding, Severity

EXAMPLE = Path(__file__).parent.parent / "examples" / "kv-full-retract.dgb"
ORDER = ["kv_saturation", "kv_retraction", "queue_buildup"]
FULL = [*ORDER, "high_latency"]  # TTFT p95 about 8 s: the symptom, explained by the pool


def _cli(*argv: str) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(list(argv))
    return buf.getvalue()


def _positions(text: str, names: list[str]) -> list[int]:
    return [text.index(n) for n in names]


def test_json_findings_start_with_the_top_cause() -> None:
    doc = json.loads(_cli("--once", "--replay", str(EXAMPLE), "--format", "json"))
    assert [f["rule"] for f in doc["findings"]] == FULL
    assert doc["findings"][0]["rule"] == doc["top"]["kv-full-retract"]["rule"] == "kv_saturation"


@pytest.mark.parametrize("verbose", [False, True])
def test_text_report_lists_the_top_cause_first(verbose: bool) -> None:
    text = _cli("--once", "--replay", str(EXAMPLE), *(["--verbose"] if verbose else []))
    # the lines that open a finding: "[WARN] rule (…" (verbose), "WARN top cause: rule (…" / "WARN rule (…"
    heads = re.findall(r"^\s*\[?(?:WARN|CRIT|info)\]? (?:top cause: )?([a-z_]+) \(", text, re.M)
    assert heads == FULL, text


def _finding(rule: str, sev: Severity, target: str = "t", state: str = "firing") -> Finding:
    return Finding(rule, sev, "high", target, "s", state=state)


def test_cause_order_top_then_explained_then_by_severity() -> None:
    fs = [_finding("cuda_graph_disabled_or_exceeded", Severity.WARNING), _finding("queue_buildup", Severity.INFO),
          _finding("kv_retraction", Severity.WARNING), _finding("low_cache_hit", Severity.INFO),
          _finding("kv_saturation", Severity.WARNING), _finding("insufficient_data", Severity.INFO)]
    got = [f.rule for f in cause_order(fs)]
    # the top cause, what it explains (the retraction, the queue, even at info), then the rest by severity
    assert got == ["kv_saturation", "kv_retraction", "queue_buildup", "cuda_graph_disabled_or_exceeded", "low_cache_hit", "insufficient_data"]
    assert explains("kv_saturation", "queue_buildup") and not explains("queue_buildup", "kv_saturation")


def test_cause_order_targets_worst_first_and_a_pending_finding_never_leads() -> None:
    fs = [_finding("queue_buildup", Severity.WARNING, "a"), _finding("oom", Severity.CRITICAL, "b"),
          _finding("kv_saturation", Severity.WARNING, "a", state="pending"), _finding("kv_retraction", Severity.WARNING, "a")]
    got = [(f.target, f.rule) for f in cause_order(fs)]
    assert got[0] == ("b", "oom")  # the worst target's top cause is findings[0]
    assert got[1] == ("a", "kv_retraction")  # firing before pending as the lead
    # a note about the inputs never leads, nor a resolved finding
    only = cause_order([_finding("insufficient_data", Severity.INFO), _finding("queue_buildup", Severity.INFO, state="resolved"),
                        _finding("low_batch_occupancy", Severity.INFO)])
    assert only[0].rule == "low_batch_occupancy"


@pytest.fixture(scope="module")
def snap_and_monitor() -> Any:
    from diagnoser.live import ReplayMonitor
    from diagnoser.replay import ReplayFeed

    feed = ReplayFeed(str(EXAMPLE), speed=1000, loop=False)
    m = ReplayMonitor(feed, ADAPTER, for_seconds=0, window_s=300, interval=1)
    try:
        snap = None
        for _ in range(20):
            snap = m.tick()
            if {f.rule for f in snap.findings} >= set(ORDER):
                break
            time.sleep(0.1)
        assert snap is not None and {f.rule for f in snap.findings} >= set(ORDER), snap and [f.rule for f in snap.findings]
        yield snap, m
    finally:
        m.close()


def test_live_surfaces_share_the_order(snap_and_monitor: Any) -> None:
    from diagnoser.cli.watch import screen
    from diagnoser.outputs.exporter import make_registry, render
    from diagnoser.outputs.term import Term
    from diagnoser.web.views import overview_doc, target_doc

    snap, m = snap_and_monitor
    assert [f.rule for f in snap.findings][:3] == ORDER
    for width in (80, 132):  # watch
        text = screen(snap, 0.0, Term(width=width))
        assert _positions(text, [f"{r}: " for r in ORDER]) == sorted(_positions(text, [f"{r}: " for r in ORDER]))
        assert all(len(ln) <= width for ln in text.splitlines())
    card = overview_doc(snap, 1.0)["targets"][0]  # the overview card
    assert [f["rule"] for f in card["findings"]][:3] == ORDER
    assert card["top_fix"]["rule"] == "kv_saturation" and card["top_fix"]["flag"] == "--max-total-tokens"
    page = target_doc(snap, snap.targets[0], m)  # the target page
    assert [f["rule"] for f in page["findings"]][:3] == ORDER
    assert page["verdict"]["rule"] == "kv_saturation" and page["top_fixes"][0]["rule"] == "kv_saturation"
    expo = render(make_registry(lambda: snap)).decode()  # the exporter, in the same order
    active = [ln for ln in expo.splitlines() if ln.startswith("diagnoser_finding_active{")]
    assert [next(r for r in FULL if f'rule="{r}"' in ln) for ln in active][:4] == FULL


def test_the_target_page_lists_every_rule_checked(snap_and_monitor: Any) -> None:
    """What was checked: the target page (and its JSON twin) lists every rule of the last pass with why it
    is fine or what it lacked to judge, as --verbose and the JSON report do."""
    from fastapi.testclient import TestClient

    from diagnoser.rules import REGISTRY
    from diagnoser.web import create_app

    snap, m = snap_and_monitor
    client = TestClient(create_app(m))
    doc = client.get("/target/0.json").json()
    rows = {c["rule"]: c for c in doc["checked"]}
    assert set(rows) == {r.name for r in REGISTRY if r.scope == "target"}
    assert rows["kv_saturation"]["status"] == "fired" and rows["low_batch_occupancy"]["status"] == "fine"
    assert rows["pd_transfer"]["status"] == "not_judged" and "pd_bootstrap_reqs" in rows["pd_transfer"]["why"]
    html = client.get("/target/0").text
    assert '<details id="checked">' in html and f"Rules checked ({len(rows)})" in html
    assert "PD01 pd_transfer" in html and "no data" in html


def test_json_and_verbose_text_list_every_rule_checked() -> None:
    from diagnoser.rules import REGISTRY

    doc = json.loads(_cli("--once", "--replay", str(EXAMPLE), "--format", "json"))
    assert [c["rule"] for c in doc["checked"]] == [r.name for r in REGISTRY]  # each once, catalogue order
    by = {c["rule"]: c for c in doc["checked"]}
    assert by["oom"] == {"rule": "oom", "code": "ER01", "target": "kv-full-retract", "status": "fine",
                         "why": "no oom, startup_oom, hicache_host_oom events in the inputs"}
    assert by["low_batch_occupancy"]["why"].startswith("read 180 running_reqs readings")  # decode lines and scrapes; a Prefill line's #running-req is not a running reading
    text = " ".join(_cli("--once", "--replay", str(EXAMPLE), "--verbose").split())
    assert f"Rules checked ({len(REGISTRY)})" in text
    assert "PD01 pd_transfer — no data: no pd_bootstrap_reqs, pd_inflight_reqs, pd_transfer_reqs readings in the inputs" in text
    assert "KV01 kv_saturation — fired" in text
