"""Never repeat a fix that already failed in the log, never escalate one (issue 25, item 3).

Built from the real SGLang 0.5.23 CPU start-up failure in tests/data/sglang-cpu-issue25/chunked-prefill-off
(its README: `--chunked-prefill-size -1`, the automatic fraction -0.049, `ValueError: Loaded weights leave no
GPU memory for the KV cache`). The issue's sequence is a user who answered that failure with
`--max-total-tokens 65536` (diagnoser's old advice) and failed the same way: the derived log below is the
real one with that value in its server_args line, as SGLang prints it (`'max_total_tokens': 65536`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from diagnoser import advice
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.evaluate import Report, check_suggestions, evaluate, failed_at_startup
from diagnoser.model import Finding, Severity, Suggestion
from tests.conftest import DATA

LOG = DATA / "sglang-cpu-issue25" / "chunked-prefill-off" / "server.log"


def _tried_65536(tmp_path: Path) -> Path:
    raw = LOG.read_bytes()  # bytes: the log's own line breaks (a text read would turn a lone CR into a line)
    assert raw.count(b"'max_total_tokens': None") == 1
    p = tmp_path / "server.log"
    p.write_bytes(raw.replace(b"'max_total_tokens': None", b"'max_total_tokens': 65536"))
    return p


def _finding(target: str, *sugg: Suggestion) -> Finding:
    return Finding(rule="kv_pool_too_small", severity=Severity.CRITICAL, confidence="high", target=target, summary="s",
                   suggestions=list(sugg))


def test_a_value_that_failed_at_startup_is_neither_repeated_nor_escalated(tmp_path: Path) -> None:
    col = collect_logs(get_adapter(), [str(_tried_65536(tmp_path))])
    tl = col.timelines[0]
    assert tl.cfg("arg.max_total_tokens") == 65536
    up = Suggestion("--max-total-tokens", 65536, 131072, "a larger pool")
    same = Suggestion("--max-total-tokens", 32768, 65536, "a larger pool")
    down = Suggestion("--max-total-tokens", 65536, 16384, "a smaller pool")
    assert failed_at_startup(tl, up).startswith("escalates a failed start-up") and "server.log:74" in failed_at_startup(tl, up)
    assert failed_at_startup(tl, same).startswith("repeats a failed start-up")
    assert failed_at_startup(tl, down) == ""
    # a larger --mem-fraction-static is the fix SGLang's message asks for: not an escalation of the failure
    assert failed_at_startup(tl, Suggestion("--mem-fraction-static", -0.049, 0.7, "fraction")) == ""
    assert failed_at_startup(tl, Suggestion("--mem-fraction-static", 0.7, -0.049, "fraction")).startswith("repeats")
    rep = Report(findings=[_finding(tl.target, up, down)])
    check_suggestions(rep, [tl])
    kept = [(s.flag, s.proposed) for s in rep.findings[0].suggestions]
    assert ("--max-total-tokens", 131072) not in kept
    assert any(d["proposed"] == 131072 and d["reason"].startswith("escalates") for d in rep.dropped), rep.dropped
    assert any("131072 is not suggested" in n for n in rep.findings[0].notes)


def test_the_whole_advice_on_the_failed_startups(tmp_path: Path) -> None:
    """The real log and the one that tried 65536: no --max-total-tokens >= 65536; the fraction fix stays
    (before, the derived log's first fix was --max-total-tokens 65536 -> 131072: the issue's escalation)."""
    for path in (LOG, _tried_65536(tmp_path)):
        col = collect_logs(get_adapter(), [str(path)])
        report = evaluate(col.timelines, get_adapter())
        advice.enrich(report, col.timelines)  # as --once does: the capacity model's vetting too (it rewrote 0.7 into 65536 -> 131072)
        props = [(s.flag, s.proposed) for f in report.findings for s in f.suggestions]
        assert not [p for p in props if p[0] == "--max-total-tokens" and isinstance(p[1], int) and p[1] >= 65536], props
        assert ("--mem-fraction-static", 0.7) in props, props


def test_a_later_start_that_served_lifts_the_guard(tmp_path: Path) -> None:
    """Only a failure after the last server_args line counts: a restart that came up is not that failure."""
    col = collect_logs(get_adapter(), [str(_tried_65536(tmp_path))])
    tl = col.timelines[0]
    starts = [e for e in tl.events if e.kind == "server_args"]
    tl.events.append(replace(starts[0], ts=max(e.ts for e in tl.events) + 60, source="server.log:99"))
    assert failed_at_startup(tl, Suggestion("--max-total-tokens", 65536, 131072, "a larger pool")) == ""
