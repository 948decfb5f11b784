"""advice.enrich: suggestions quantified by the capacity model, ranked by gain, still checked.

The seed case (tests/cases/seed-kimi-k25) is written by us from issue 4's numbers (see its source.md);
it runs through the same CLI path as ``diagnose --once --log … --model-config …``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diagnoser.advice import HICACHE_NOTE, enrich
from diagnoser.cli import run
from diagnoser.engines import get_adapter
from diagnoser.evaluate import Report
from diagnoser.model import Finding, Severity, Suggestion

SEED = Path(__file__).parent / "cases" / "seed-kimi-k25"
DP_FLAGS = ("--enable-dp-attention", "--attn-dp-size")


def case_args(case: Path) -> list[str]:
    extra = json.loads((case / "args.json").read_text()) if (case / "args.json").exists() else []
    return ["--once", "--log", str(case / "server.log")] + [a.replace("{case}", str(case)) for a in extra]


def analyse(argv: list[str]) -> tuple[Any, dict[str, Any]]:
    args = run.build_parser().parse_args(argv)
    adapter = get_adapter("sglang")
    col = run.gather(args, adapter)
    return run.analyse(args, col, adapter)


@pytest.fixture(scope="module")
def seed_doc() -> dict[str, Any]:
    _, doc = analyse(case_args(SEED))
    return doc


def kv_finding(doc: dict[str, Any]) -> dict[str, Any]:
    found = [f for f in doc["findings"] if f["rule"] == "kv_saturation"]
    assert found, [f["rule"] for f in doc["findings"]]
    return found[0]


def test_seed_shows_kv_saturation_with_a_ranked_quantified_list(seed_doc: dict[str, Any]) -> None:
    f = kv_finding(seed_doc)
    sugs = f["suggestions"]
    flags = [s["flag"] for s in sugs]
    assert any(fl in DP_FLAGS for fl in flags) and "--mem-fraction-static" in flags and "--kv-cache-dtype" in flags
    gains = [s["gain"] for s in sugs if s["gain"] is not None]
    assert gains == sorted(gains, reverse=True)  # ranked by expected gain
    for s in sugs:
        if s["flag"] in DP_FLAGS + ("--mem-fraction-static", "--kv-cache-dtype"):
            proj = s["projection"]
            assert proj["pool_tokens"] > 116171, s
            assert proj["projected_running"] > 52 and proj["projected_gen_throughput_tps"] > 834
            assert proj["job_eta_hours"] < 120
            assert "tokens" in s["effect"] and "tok/s" in s["effect"] and "ETA" in s["effect"]


def test_seed_mem_fraction_carries_a_headroom_warning(seed_doc: dict[str, Any]) -> None:
    s = next(s for s in kv_finding(seed_doc)["suggestions"] if s["flag"] == "--mem-fraction-static")
    assert 0.85 < float(s["proposed"]) <= 0.90
    assert s["projection"]["headroom_gib"] >= 6.0
    assert "5–8" in s["effect"] and "GiB left for activations" in s["effect"]


def test_seed_dp_attention_states_its_assumption(seed_doc: dict[str, Any]) -> None:
    s = next(s for s in kv_finding(seed_doc)["suggestions"] if s["flag"] in DP_FLAGS)
    assert "replicated" in s["effect"] and "own pool" in s["effect"]
    assert s["projection"]["projected_running"] == 150  # the client's concurrency caps it


def test_seed_hicache_described_as_prefix_cache_and_no_cpu_offload(seed_doc: dict[str, Any]) -> None:
    f = kv_finding(seed_doc)
    assert HICACHE_NOTE in f["notes"]
    assert "not the number of requests that can decode at once" in HICACHE_NOTE
    text = json.dumps(seed_doc)
    assert "--cpu-offload-gb" not in [s["flag"] for x in seed_doc["findings"] for s in x["suggestions"]]
    assert "cpu-offload" not in text.replace("cpu_offload_gb", "")  # not even mentioned as advice
    for x in seed_doc["findings"]:
        for s in x["suggestions"]:
            assert not s["flag"].startswith("--hicache") and s["flag"] != "--enable-hierarchical-cache"


def test_seed_notes_give_eta_and_capacity(seed_doc: dict[str, Any]) -> None:
    notes = " ".join(kv_finding(seed_doc)["notes"])
    assert "70,272 KV bytes per token" in notes and "ETA at the current rate" in notes and "days" in notes


def test_seed_text_report_shows_the_numbers() -> None:
    from diagnoser.outputs.text import render

    _, doc = analyse(case_args(SEED))
    out = render(doc)
    assert "kv_saturation" in out and "→" in out and "tok/s" in out


def log_timeline(path: Path) -> Any:
    from diagnoser.collect import collect_logs

    return collect_logs(get_adapter("sglang"), [str(path)]).timelines[0]


def _report(findings: list[Finding]) -> Report:
    r = Report()
    r.findings = findings
    return r


def test_contradictions_still_refused_after_enrich() -> None:
    """An OOM finding lowering the fraction beats kv_saturation's raise: ours is dropped, not both kept."""
    tl = log_timeline(SEED / "server.log")
    kv = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full")
    oom = Finding("oom", Severity.CRITICAL, "high", tl.target, "oom",
                  suggestions=[Suggestion("--mem-fraction-static", 0.85, 0.82, "OOM under load")])
    rep = _report([oom, kv])
    enrich(rep, [tl], {"model_config": str(SEED / "config.json"), "client_concurrency": 150})
    fractions = [(f.rule, s.proposed) for f in rep.findings for s in f.suggestions if s.flag == "--mem-fraction-static"]
    assert fractions == [("oom", 0.82)]
    assert any(d["rule"] == "kv_saturation" and "contradicts" in d["reason"] for d in rep.dropped)
    # the lowered fraction is quantified too: a smaller pool and more headroom
    s = next(s for s in oom.suggestions if s.flag == "--mem-fraction-static")
    assert s.projection["pool_tokens"] < 116171 and s.projection["headroom_gib"] > 11.42


def test_cpu_offload_never_survives_enrich() -> None:
    tl = log_timeline(SEED / "server.log")
    f = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full",
                suggestions=[Suggestion("--cpu-offload-gb", 0, 40, "free GPU memory")])
    rep = _report([f])
    enrich(rep, [tl], {})
    assert all(s.flag != "--cpu-offload-gb" for s in f.suggestions)
    assert any(d["flag"] == "--cpu-offload-gb" for d in rep.dropped)


def test_without_model_config_it_says_what_is_missing() -> None:
    tl = log_timeline(SEED / "server.log")
    f = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full")
    enrich(_report([f]), [tl], {})
    assert any("--model-config" in n for n in f.notes)
    # the engine's own KV size still sizes the pool and the fraction change
    s = next(s for s in f.suggestions if s.flag == "--mem-fraction-static")
    assert s.projection["pool_tokens"] > 116171


def test_a_capacity_failure_is_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnoser.advice as advice

    tl = log_timeline(SEED / "server.log")
    f = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full",
                suggestions=[Suggestion("--mem-fraction-static", 0.85, 0.9, "grow the pool")])

    def boom(*a: Any, **k: Any) -> Any:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(advice, "planner_for", boom)
    rep = _report([f])
    enrich(rep, [tl], {})
    assert [s.proposed for s in f.suggestions] == [0.9]  # the rule's suggestion stands, unquantified
    assert [(e.rule, e.error) for e in rep.errors] == [("capacity", "ZeroDivisionError: boom")]


def test_seed_dp_attention_pairs_with_the_same_fraction_as_the_fraction_suggestion(seed_doc: dict[str, Any]) -> None:
    sugs = kv_finding(seed_doc)["suggestions"]
    frac = next(s for s in sugs if s["flag"] == "--mem-fraction-static")["proposed"]
    dp = next(s for s in sugs if s["flag"] in DP_FLAGS)
    assert f"--mem-fraction-static {float(frac):g}" in dp["projection"]["extra_flags"]


def test_a_bad_model_config_is_reported_once_and_the_rest_still_works(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    _, doc = analyse(case_args(SEED)[:3] + ["--model-config", str(bad)])
    errs = [e for e in doc["errors"] if e.get("rule") == "capacity"]
    assert len(errs) == 1 and "not readable JSON" in errs[0]["error"]
    s = next(s for s in kv_finding(doc)["suggestions"] if s["flag"] == "--mem-fraction-static")
    assert s["projection"]["pool_tokens"] > 116171  # the engine's own numbers still size it


def test_what_advice_adds_goes_through_the_checks_too() -> None:
    """advice adds DP attention needing --mem-fraction-static 0.9 as well; an OOM finding lowering the
    fraction outranks it, so that suggestion is refused like the plain fraction raise."""
    tl = log_timeline(SEED / "server.log")
    kv = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full")
    oom = Finding("oom", Severity.CRITICAL, "high", tl.target, "oom",
                  suggestions=[Suggestion("--mem-fraction-static", 0.85, 0.82, "OOM under load")])
    rep = _report([oom, kv])
    enrich(rep, [tl], {"model_config": str(SEED / "config.json"), "client_concurrency": 150})
    for f in rep.findings:
        for s in f.suggestions:
            for extra in (s.projection or {}).get("extra_flags", []):
                assert not extra.startswith("--mem-fraction-static"), (f.rule, s.flag, extra)
    dp = [d for d in rep.dropped if d["flag"] in DP_FLAGS]
    assert dp and "contradicts oom" in dp[0]["reason"] and "--mem-fraction-static 0.9" in dp[0]["reason"]


def test_advice_suggestion_proposing_the_inputs_current_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suggestion whose own current is unknown but whose value the inputs show as current is a no-op."""
    import diagnoser.advice as advice

    tl = log_timeline(SEED / "server.log")
    assert tl.cfg("schedule_conservativeness") == 1.0  # from the server args line
    real = advice._kv_saturation

    def adds_noop(f: Finding, *a: Any) -> None:
        real(f, *a)
        f.suggestions.append(Suggestion("--schedule-conservativeness", None, 1.0, "added late"))

    monkeypatch.setattr(advice, "_kv_saturation", adds_noop)
    f = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full")
    rep = _report([f])
    enrich(rep, [tl], {})
    assert [s.flag for s in f.suggestions] and all(s.flag != "--schedule-conservativeness" for s in f.suggestions)
    assert any(d["flag"] == "--schedule-conservativeness" and d["reason"] == "proposes the current value" for d in rep.dropped)


def test_checks_run_even_when_advice_fails_outside_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnoser.advice as advice

    tl = log_timeline(SEED / "server.log")
    f = Finding("kv_saturation", Severity.WARNING, "high", tl.target, "full",
                suggestions=[Suggestion("--cpu-offload-gb", 0, 40, "free GPU memory")])

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(advice, "_enrich", boom)
    rep = _report([f])
    with pytest.raises(RuntimeError):
        enrich(rep, [tl], {})
    assert f.suggestions == [] and rep.dropped[0]["flag"] == "--cpu-offload-gb"


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
METRICS_OFF = Path(__file__).parent / "cases" / "204-metrics-disabled"


@pytest.mark.parametrize("argv", [["--log", str(EXAMPLES / "kv-full-retract" / "server.log")],
                                  ["--replay", "{data}/sglang-cpu-real/kv-full-retract"],
                                  ["--replay", "{data}/sglang-cpu-real/medium-engine-bound-kv-full"]])
def test_no_fp8_kv_proposed_on_a_cpu_engine(argv: list[str]) -> None:
    from tests.conftest import DATA

    argv = [argv[0], argv[1].replace("{data}", str(DATA))]
    _, doc = analyse(["--once", *argv])
    kv = kv_finding(doc)
    assert kv["suggestions"], kv  # the pool cap is still the lever
    flags = [s["flag"] for f in doc["findings"] for s in f["suggestions"]]
    assert "--kv-cache-dtype" not in flags
    assert "fp8" not in json.dumps([f["suggestions"] for f in doc["findings"]])


def test_no_gain_effect_says_what_binds_instead_of_contradicting_itself() -> None:
    """Case 204: --max-running-requests 4 → 48 (the pool holds 312 at the observed length, but the demand
    seen bounds the proposal: about 40 in flight x 1.25) while the client sends only 4 at a time."""
    _, doc = analyse(["--once", "--log", str(METRICS_OFF / "server.log"), "--client-concurrency", "4"])
    s = next(s for f in doc["findings"] for s in f["suggestions"] if s["flag"] == "--max-running-requests")
    assert s["current"] == 4 and s["proposed"] == 48
    assert s["projection"]["projected_running"] == 4 and s["projection"]["limit"] == "the client's concurrency (4)"
    assert s["effect"].startswith("running stays at 4: the client's concurrency (4) binds first, so no throughput gain is projected")
    assert "running 4 → 4" not in s["effect"] and "no change to the pool or the running batch" not in s["effect"]
    assert "Once the client's concurrency no longer binds: up to" in s["effect"]
    # without the client's number the demand seen binds, and the effect moves with the change
    _, doc = analyse(["--once", "--log", str(METRICS_OFF / "server.log")])
    s = next(s for f in doc["findings"] for s in f["suggestions"] if s["flag"] == "--max-running-requests")
    assert s["effect"].startswith("running 4 → 40;") and s["projection"]["projected_running"] == 40
    assert "Once the demand seen no longer binds: up to" in s["effect"]  # the rule's 78x is a ceiling, not the projection
