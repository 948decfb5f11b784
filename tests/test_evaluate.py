"""The rule engine: isolation, suggestion checks, hysteresis, and the catalogue's shape."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from diagnoser.evaluate import Hysteresis, Report, check_suggestions, evaluate, select_rules
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules import REGISTRY, Rule, by_name
from diagnoser.rules.base import DOC_HEADINGS, RuleContext
from tests.rules.helpers import ADAPTER, window

CATALOGUE = ["kv_saturation", "kv_retraction", "queue_buildup", "low_batch_occupancy", "client_bound", "prefill_stall",
             "max_running_requests_cap", "cuda_graph_disabled_or_exceeded", "low_spec_acceptance", "low_cache_hit",
             "dp_imbalance", "prefill_decode_interference", "oom", "runaway_generation", "source_unreachable",
             "metrics_disabled", "insufficient_data",
             # issue 15: crashes, a pool too small for its requests, the PD hand-over
             "engine_crash", "engine_leak", "kv_pool_too_small", "pd_transfer", "request_outcomes",
             # issue 28: vllm-doctor's TTFT/TPOT thresholds, judged on the canonical latency signals
             "high_latency"]


def test_catalogue_has_exactly_the_issue_names() -> None:
    names = [r.name for r in REGISTRY if r.scope == "target"]
    assert sorted(names) == sorted(CATALOGUE)
    assert len({r.code for r in REGISTRY}) == len(REGISTRY)


@pytest.mark.parametrize("rule", REGISTRY, ids=[r.name for r in REGISTRY])
def test_every_rule_documents_itself_and_cites_the_reference(rule: type[Rule]) -> None:
    sections = rule.doc_sections()
    for h in DOC_HEADINGS:
        assert sections.get(h), f"{rule.name}: empty '{h}'"
    assert "docs/sglang.md#" in sections["References"]  # the project's own notes, anchors checked in test_docs.py
    for key in rule.defaults:
        assert key in rule.threshold_help, f"{rule.name}.{key} has no help text"
        assert key in rule.doc() or rule.threshold_help[key], key
    assert by_name(rule.name) is rule and by_name(rule.code.lower()) is rule


class _Boom(Rule):
    """Raises.

    What it detects: nothing.
    Why it matters: isolation.
    Evidence: none.
    Fix: none.
    Known false positives: none.
    References: none.
    """

    name = "boom"
    code = "ZZ99"

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        raise RuntimeError("kaput")


class _Fixed(Rule):
    """Always fires with the suggestions it is given.

    What it detects: a test fixture.
    Why it matters: isolation.
    Evidence: none.
    Fix: none.
    Known false positives: none.
    References: none.
    """

    name = "fixed"
    code = "ZZ98"
    sugg: ClassVar[list[Suggestion]] = []
    sev: ClassVar[Severity] = Severity.WARNING

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        return self.finding(ctx, "fixed", [], list(self.sugg), severity=self.sev)


def test_a_raising_rule_is_listed_and_the_others_still_run() -> None:
    tl = window(token_usage=[0.99] * 5, queue_reqs=[5] * 5, running_reqs=[10] * 5)
    rep = evaluate([tl], ADAPTER, rules=[_Boom, by_name("kv_saturation")])  # type: ignore[list-item]
    assert [e.rule for e in rep.errors] == ["boom"] and "kaput" in rep.errors[0].error
    assert [f.rule for f in rep.findings] == ["kv_saturation"]


def _report(*findings: tuple[str, Severity, list[Suggestion]]) -> Report:
    rep = Report()
    for rule, sev, sugg in findings:
        rep.findings.append(Finding(rule, sev, "high", "t", "s", [], list(sugg)))
    return rep


def test_check_suggestions_refuses_current_value_offload_and_contradictions() -> None:
    rep = _report(
        ("a", Severity.WARNING, [Suggestion("--schedule-conservativeness", 1.0, 1.3, "why"),
                                 Suggestion("--mem-fraction-static", "0.85", 0.85, "same"),
                                 Suggestion("--cpu-offload-gb", 0, 20, "never")]),
        ("b", Severity.INFO, [Suggestion("--schedule-conservativeness", 1.0, 0.3, "opposite")]),
        ("c", Severity.INFO, [Suggestion("--schedule-conservativeness", 1.0, 1.3, "again")]),
    )
    check_suggestions(rep, [])
    kept = {f.rule: [(s.flag, s.proposed) for s in f.suggestions] for f in rep.findings}
    assert kept == {"a": [("--schedule-conservativeness", 1.3)], "b": [], "c": []}
    reasons = {(d["rule"], d["flag"]): d["reason"] for d in rep.dropped}
    assert reasons[("a", "--mem-fraction-static")] == "proposes the current value"
    assert "never proposed" in reasons[("a", "--cpu-offload-gb")]
    assert reasons[("b", "--schedule-conservativeness")].startswith("contradicts a")
    assert reasons[("c", "--schedule-conservativeness")].startswith("same change already suggested by a")


def test_no_contradicting_suggestions_on_the_real_runs(data_dir: Any) -> None:
    from tests.test_cases import CASE_DIRS, run_case

    for case in CASE_DIRS:
        try:
            doc = run_case(case)
        except pytest.skip.Exception:
            continue
        seen: dict[tuple[str, str], Any] = {}
        for f in doc["findings"]:
            for s in f["suggestions"]:
                key = (f["target"], s["flag"])
                assert key not in seen or seen[key] == s["proposed"], f"{case.name}: {key} {seen.get(key)} vs {s['proposed']}"
                seen[key] = s["proposed"]


def test_select_and_ignore() -> None:
    assert [r.name for r in select_rules(["KV01", "oom"])] == ["kv_saturation", "oom"]
    assert "kv_saturation" not in [r.name for r in select_rules(None, ["kv_saturation"])]


def test_hysteresis_pending_firing_resolved() -> None:
    h = Hysteresis({"kv_saturation": 60.0})
    f = Finding("kv_saturation", Severity.WARNING, "high", "t", "s")
    assert h.update([f], now=0)[0].state == "pending"
    assert h.update([f], now=59)[0].state == "pending"
    assert h.update([f], now=60)[0].state == "firing"
    assert h.update([], now=61) == [] and h.resolved[0].state == "resolved"
    # a pending finding that stops matching is dropped silently (never fired)
    h.update([Finding("kv_saturation", Severity.WARNING, "high", "t", "s")], now=100)
    h.update([], now=101)
    assert h.resolved == []


def test_hysteresis_input_health_and_info_fire_at_once() -> None:
    h = Hysteresis()
    out = h.update([Finding("source_unreachable", Severity.CRITICAL, "high", "t", "s"),
                    Finding("client_bound", Severity.INFO, "medium", "t", "s")], now=0)
    assert [f.state for f in out] == ["firing", "firing"]


def test_findings_sorted_by_severity() -> None:
    tl = window(token_usage=[0.99] * 5, queue_reqs=[5] * 5, running_reqs=[2] * 5,
                events=[("oom", 2, {"phase": "decode", "text": "Decode out of memory."})])
    rep = evaluate([tl], ADAPTER)
    sev = [int(f.severity) for f in rep.findings]
    assert sev == sorted(sev, reverse=True) and rep.findings[0].rule == "oom"


def test_docs_rules_md_is_current() -> None:
    from pathlib import Path

    from diagnoser.cli.rules_cmd import markdown

    path = Path(__file__).resolve().parent.parent / "docs" / "rules.md"
    assert path.read_text() == markdown(), "docs/rules.md is stale: regenerate it (command at its top)"


def test_explain_prints_doc_and_thresholds(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main as cli_main

    assert cli_main(["explain", "kv_retraction"]) == 0
    out = capsys.readouterr().out
    assert "What it detects" in out and "kv_retraction.frequent_per_min = 1.0" in out
    assert "docs/sglang.md#tuning-guide" in out and "``" not in out
    assert cli_main(["explain", "nope"]) == 2
