"""The top cause of a target (evaluate.top_cause): the same whatever the confidence, a cause before its
symptoms, the pool before the retractions it causes, a server that stopped serving first."""

from __future__ import annotations

from diagnoser.evaluate import top_cause
from diagnoser.model import Finding, Severity, Suggestion


def f(rule: str, sev: Severity = Severity.WARNING, conf: str = "medium", flag: str | None = None) -> Finding:
    return Finding(rule, sev, conf, "t", rule, suggestions=[Suggestion(flag, 1, 2, "why")] if flag else [])


def test_cause_before_symptom_and_confidence_plays_no_part() -> None:
    for conf in ("low", "medium", "high"):
        top, s = top_cause([f("queue_buildup", Severity.WARNING, "high"), f("kv_retraction", conf=conf, flag="--schedule-conservativeness"),
                            f("kv_saturation", conf="low" if conf == "high" else "high", flag="--max-total-tokens")], "t")
        assert top is not None and top.rule == "kv_saturation" and s is not None and s.flag == "--max-total-tokens"


def test_first_change_comes_from_the_next_cause_when_the_top_has_none() -> None:
    top, s = top_cause([f("kv_saturation"), f("kv_retraction", flag="--schedule-conservativeness"), f("queue_buildup")], "t")
    assert top is not None and top.rule == "kv_saturation" and s is not None and s.flag == "--schedule-conservativeness"


def test_an_info_cause_is_top_when_nothing_warns_and_a_crash_is_top_over_slowness() -> None:
    top, s = top_cause([f("low_batch_occupancy", Severity.INFO), f("client_bound", Severity.INFO)], "t")
    assert top is not None and top.rule == "client_bound" and s is None
    top, _ = top_cause([f("kv_saturation", Severity.CRITICAL), f("engine_crash", Severity.CRITICAL)], "t")
    assert top is not None and top.rule == "engine_crash"
    assert top_cause([f("kv_saturation")], "other") == (None, None)


def test_a_note_about_the_inputs_is_never_the_top_cause() -> None:
    """insufficient_data says how much was read, not what limits the server: a start-up log alone has no
    top cause, and beside a real cause the note never leads."""
    assert top_cause([f("insufficient_data", Severity.INFO)], "t") == (None, None)
    top, _ = top_cause([f("insufficient_data", Severity.INFO, "high"), f("client_bound", Severity.INFO, "low")], "t")
    assert top is not None and top.rule == "client_bound"
