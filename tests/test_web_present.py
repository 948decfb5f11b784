"""What the dashboard leads with (diagnoser/web/present.py): the top fixes, the verdict, and suggestions
that state each assumption once. Proven on the real findings of a replayed SGLang 0.5.23 CPU run
(examples/kv-full-retract.dgb, from tests/data/sglang-cpu-real/kv-full-retract), plus the edge cases."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from diagnoser.engines import get_adapter
from diagnoser.live import ReplayMonitor
from diagnoser.replay import ReplayFeed
from diagnoser.web import views
from diagnoser.web.present import one_line, present_suggestion, top_fixes, verdict
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def replay() -> Iterator[tuple[Any, Any]]:
    feed = ReplayFeed(str(ROOT / "examples" / "kv-full-retract.dgb"), speed=1000, loop=False)
    m = ReplayMonitor(feed, get_adapter("sglang"), interval=0.1, for_seconds=0, window_s=60)
    deadline = time.monotonic() + 30
    snap = m.tick()
    while time.monotonic() < deadline and not any(f.rule == "kv_saturation" and f.suggestions for f in snap.firing()):
        time.sleep(0.05)
        snap = m.tick()
    yield m, snap
    m.close()


@pytest.fixture(scope="module")
def doc(replay: tuple[Any, Any]) -> dict[str, Any]:
    m, snap = replay
    return views.target_doc(snap, snap.targets[0], m)


def test_real_suggestions_state_each_assumption_once(doc: dict[str, Any]) -> None:
    sugs = [s for f in doc["findings"] for s in f["suggestions"]]
    assert any("Assumes: " in s["effect"] for s in sugs)  # the advice folds them into the effect …
    for s in sugs:
        assert "Assumes: " not in s["effect_text"], s["effect_text"]  # … the page shows them once, below
        shown = s["effect_text"] + " " + " ".join(s["assumes"]) + " " + " ".join(s["risks"])
        for a in s["assumptions"]:
            assert shown.count(a.rstrip(".")) == 1, (a, shown)
        assert len(s["assumes"]) == len({a.lower() for a in s["assumes"]})
        assert s["effect_text"] and s["effect_line"] and "\n" not in s["effect_line"]


def test_real_top_fixes_and_verdict(doc: dict[str, Any], replay: tuple[Any, Any]) -> None:
    fixes = doc["top_fixes"]
    assert fixes and doc["top_fix"] == fixes[0]
    assert len({x["flag"] for x in fixes}) == len(fixes)  # one per flag
    assert fixes[0]["rule"] == "kv_saturation" and fixes[0]["flag"] == "--max-total-tokens"  # the pool is capped at 2048
    assert fixes[0]["current_text"] == "2048" and fixes[0]["proposed"] > 2048
    assert "→" in fixes[0]["effect_line"] and any(c["label"] == "running after" for c in fixes[0]["chips"])
    v = doc["verdict"]
    assert v["rule"] == "kv_saturation" and v["level"] == "warning" and "KV token usage" in v["text"] and v["others"] >= 1
    m, snap = replay
    assert views.target_summary(snap, snap.targets[0])["top_fix"] == fixes[0]  # the overview card carries the same fix


def test_bands_mark_when_findings_fired_in_the_recordings_clock(replay: tuple[Any, Any]) -> None:
    m, snap = replay
    t = snap.targets[0]
    eps = {e["rule"]: e for e in snap.episodes if e["target"] == t.name}
    kv = eps["kv_saturation"]
    start = t.window[0]
    assert kv["end"] is None and kv["severity"] == "warning"  # still firing
    assert start - 60 <= kv["start"] <= snap.ts  # the recording's clock (its window), not the wall clock
    marks = views.series_doc(m, t, 3600)["marks"]
    assert {"rule": "kv_saturation", "severity": "warning", "start": kv["start"], "end": None} in marks
    assert views.series_doc(m, t, 300)["tz"] == "UTC"


def test_an_episode_closes_when_its_finding_resolves() -> None:
    from diagnoser.live import LiveMonitor
    from diagnoser.model import Finding, Severity

    m = LiveMonitor(get_adapter("sglang"), [], [])
    f = Finding("queue_buildup", Severity.WARNING, "high", "t", "s")
    f.state = "pending"
    m._track_episodes([f], [], {"t": 100.0}, 0.0)
    assert list(m.episodes) == []  # pending is not firing yet
    f.state = "firing"
    m._track_episodes([f], [], {"t": 110.0}, 0.0)
    worse = Finding("queue_buildup", Severity.CRITICAL, "high", "t", "s")
    m._track_episodes([worse], [], {"t": 120.0}, 0.0)
    m._track_episodes([], [worse], {"t": 130.0}, 0.0)
    assert list(m.episodes) == [{"target": "t", "rule": "queue_buildup", "severity": "critical", "start": 110.0, "end": 130.0}]
    m.close()


def _s(flag: str, gain: float | None, effect: str = "", fits: bool = True, **kw: Any) -> dict[str, Any]:
    return {"flag": flag, "current": 1, "proposed": 2, "why": "w", "effect": effect, "assumptions": kw.get("assumptions", []),
            "gain": gain, "projection": {"fits": fits, "risks": kw.get("risks", []), "confidence": "low"}}


def _f(rule: str, sev: str, state: str, *sugs: dict[str, Any]) -> dict[str, Any]:
    return {"rule": rule, "severity": sev, "state": state, "summary": f"{rule} summary", "suggestions": [present_suggestion(s) for s in sugs]}


def test_top_fixes_order_dedupe_and_refusals() -> None:
    # the findings come in the report's one order (evaluate.cause_order), here c, b, a, d
    findings = [
        _f("c_warn", "warning", "firing", _s("--w", 0.9), _s("--y", 2.0)),
        _f("b_warn", "warning", "firing", _s("--y", 0.1), _s("--z", None), _s("--big", 3.0, fits=False)),
        _f("a_info", "info", "firing", _s("--x", 5.0)),
        _f("d_crit", "critical", "pending", _s("--p", 9.0)),
    ]
    got = [(x["flag"], x["rule"]) for x in top_fixes(findings, limit=10)]
    # firing before pending, then the findings' order, then gain within a finding; a flag once; a change
    # that does not fit never
    assert got == [("--y", "c_warn"), ("--w", "c_warn"), ("--z", "b_warn"), ("--x", "a_info"), ("--p", "d_crit")]
    # the order decides, not the severity or the gain: the same findings with a first give its fix first
    assert top_fixes([findings[2], *findings[:2]], 1)[0]["flag"] == "--x"
    assert top_fixes(findings, 1)[0]["flag"] == "--y"
    assert top_fixes([_f("r", "warning", "resolved", _s("--q", 1.0))]) == []


def test_assumptions_stripped_only_when_they_match_exactly() -> None:
    a = ["the device has memory free", "running then bound by the KV pool"]
    eff = "pool 2 → 4 tokens; running 1 → 2 (low confidence). Risk: may OOM. Assumes: running then bound by the KV pool; the device has memory free. — more slots"
    p = present_suggestion(_s("--m", 1.0, eff, assumptions=a + ["may OOM."], risks=["may OOM."]))
    assert p["effect_text"] == "pool 2 → 4 tokens; running 1 → 2 (low confidence). — more slots"
    assert p["assumes"] == a and p["risks"] == ["may OOM."]
    assert p["effect_line"] == "Pool 2 → 4 tokens; running 1 → 2 (low confidence)."
    # wording that does not match the list: the effect is left whole rather than cut wrongly
    odd = "x (low confidence). Assumes: something else entirely."
    assert present_suggestion(_s("--m", 1.0, odd, assumptions=a))["effect_text"] == odd


def test_one_line_prefers_the_rules_claim_when_the_model_does_not_size_it() -> None:
    unsized = "the capacity model does not size this change: pool and slot cap stay as they are (low confidence). — fewer retractions"
    assert one_line(unsized) == "Fewer retractions"
    bound = "running stays at 5: the client binds first (low confidence). Once the client no longer binds: 8x the slots"
    assert one_line(bound) == "8x the slots · running stays at 5: the client binds first (low confidence)."
    moved = "pool 2 → 4 tokens; running 1 → 2 (low confidence). — about 2x the slots"
    assert one_line(moved) == "Pool 2 → 4 tokens; running 1 → 2 (low confidence)."
    chunk = "21.1 GiB left for activations and graphs (low confidence). — about 2x fewer prefill steps per prompt"
    assert one_line(chunk) == "About 2x fewer prefill steps per prompt · 21.1 GiB left for activations and graphs (low confidence)."
    assert one_line("pool 1 → 2 (high confidence). Needs also: --mem-fraction-static 0.9.") == "Pool 1 → 2 (high confidence)."
    assert one_line("") == ""


def test_verdict_states() -> None:
    assert verdict({"health": "down", "last_error": "refused", "findings": []}, [])["level"] == "down"
    assert verdict({"health": "ok", "findings": []}, [])["title"] == "Healthy"
    pend = verdict({"health": "ok", "findings": [{"rule": "queue_buildup", "state": "pending", "severity": "warning"}]}, [])
    assert pend["level"] == "pending" and "queue_buildup" in pend["text"]
    fs = [{"rule": "a", "state": "firing", "severity": "critical", "summary": "A"}, {"rule": "b", "state": "firing", "severity": "warning", "summary": "B"}]
    assert verdict({"health": "critical", "findings": fs}, [])["rule"] == "a"  # the worst, without a fix
    assert verdict({"health": "critical", "findings": fs}, [{"rule": "b"}])["rule"] == "b"  # the one the top fix is for


def test_tiles_say_median_and_max_or_the_last_readings_age() -> None:
    from types import SimpleNamespace

    ws = {"running_reqs": {"n": 40, "median": 4.0, "max": 4.0, "last": 0.0, "last_ts": 1000.0},
          "queue_reqs": {"n": 40, "median": 8.0, "max": 12.0, "last": 0.0, "last_ts": 1000.0},
          "token_usage": {"n": 1, "median": 0.3, "max": 0.3, "last": 0.3, "last_ts": 995.0},
          "_data": {"first": 870.0, "last": 1000.0}, "_window": {"start": 700.0, "end": 1000.0}}
    t = SimpleNamespace(window_stats=ws, latest={"running_reqs": 0.0, "queue_reqs": 0.0, "token_usage": 0.3, "cache_hit_rate": 0.5},
                        config={}, window=(870.0, 1000.0))
    tiles = {h["signal"]: h for h in views.headline(t)}
    # the last readings were 0 (the run drained): the tile shows the window's median and max, not a bare 0
    assert tiles["queue_reqs"]["text"] == "8" and tiles["queue_reqs"]["max_text"] == "12" and tiles["queue_reqs"]["how"] == "median · max"
    assert tiles["token_usage"]["how"] == "last reading, 5 s ago" and tiles["token_usage"]["text"] == "0.30"
    assert tiles["cache_hit_rate"]["how"] == "before the window"  # no reading in the window: said so
    w = views.window_doc(t)
    assert w["text"] == "5 min, 2 min 10 s of data (00:14:30 → 00:16:40)" and w["start"] == "1970-01-01T00:11:40Z"
    assert views.stamp(1796222311.987654) == "2026-12-02T14:38:31Z"  # to the second


def test_bands_only_for_warnings_firing_now() -> None:
    eps = [{"target": "a", "rule": "kv_saturation", "severity": "warning", "start": 10.0, "end": None},
           {"target": "a", "rule": "low_cache_hit", "severity": "info", "start": 11.0, "end": None},
           {"target": "a", "rule": "queue_buildup", "severity": "warning", "start": 12.0, "end": None},
           {"target": "a", "rule": "kv_retraction", "severity": "critical", "start": 5.0, "end": 9.0},
           {"target": "b", "rule": "oom", "severity": "critical", "start": 5.0, "end": None}]
    bands, resolved = views.band_marks(eps, "a", 0.0, {"kv_saturation": "warning", "low_cache_hit": "info", "queue_buildup": "info"})
    assert [m["rule"] for m in bands] == ["kv_saturation"]  # info, eased to info, resolved, another target: not shaded
    assert [m["rule"] for m in resolved] == ["kv_retraction"]
