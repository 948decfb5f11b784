"""The /metrics exporter: fixed names, values read from the live state, stale finding series removed on
resolve, projections of the top suggestion, and `promtool check metrics` clean (real promtool)."""

from __future__ import annotations

import subprocess
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from diagnoser.live import Snapshot, TargetView
from diagnoser.model import ConfigFact, Finding, Severity, Suggestion
from diagnoser.outputs.exporter import make_registry, projected, render
from tests.browser.serve_proc import need_binary

NAMES = {
    "diagnoser_finding_active", "diagnoser_signal", "diagnoser_pool_capacity_tokens", "diagnoser_suggestion_info",
    "diagnoser_suggestion_projected_running_reqs", "diagnoser_suggestion_projected_gen_throughput_tps",
    "diagnoser_scrape_up", "diagnoser_scrape_duration_seconds", "diagnoser_scrape_errors", "diagnoser_rule_pass_duration_seconds",
}


def _view(i: int, name: str, up: bool | None, latest: dict[str, float], engine: str = "sglang") -> TargetView:
    return TargetView(engine=engine, index=i, name=name, is_url=True, up=up, last_error="" if up else "refused", scrapes=10, scrape_errors=0 if up else 3,
                      last_scrape_ts=1.0, last_duration_s=0.012, version="0.5.23", latest=latest,
                      config={"max_total_tokens": ConfigFact(2048, "get_server_info")}, model_name="m", window=(0.0, 1.0))


def _snap(findings: list[Finding]) -> Snapshot:
    return Snapshot(ts=1.0, tick=1, targets=[_view(0, "http://a:30000", True, {"running_reqs": 7.0, "token_usage": 0.96, "not_a_signal": 1.0, "queue_reqs": float("nan")}),
                                             _view(1, "http://b:30000", False, {}, engine="vllm")],
                    findings=findings, resolved=[], errors=[], rule_pass_s=0.003)


def _kv(state: str = "firing") -> Finding:
    s = Suggestion("--max-total-tokens", 2048, 16384, "pool too small", projection={"max_concurrent_requests": 46, "projected_running": 40.0, "projected_gen_throughput_tps": 3789.0})
    s2 = Suggestion("--kv-cache-dtype", "auto", "fp8_e4m3", "halve bytes", projection={"max_concurrent_requests": 13})
    return Finding("kv_saturation", Severity.WARNING, "high", "http://a:30000", "full", suggestions=[s, s2], state=state)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exposition_values_and_names() -> None:
    holder: dict[str, Any] = {"snap": _snap([_kv(), _kv("pending")])}
    reg = make_registry(lambda: holder["snap"])
    text = render(reg).decode()
    fams = {f.name for f in text_string_to_metric_families(text)}
    assert fams == NAMES
    s = _samples(text)
    assert s[("diagnoser_finding_active", (("engine", "sglang"), ("rule", "kv_saturation"), ("severity", "warning"), ("target", "http://a:30000")))] == 1.0
    assert sum(1 for k in s if k[0] == "diagnoser_finding_active") == 1  # pending is not active
    assert s[("diagnoser_signal", (("engine", "sglang"), ("signal", "running_reqs"), ("target", "http://a:30000")))] == 7.0
    assert not any(k[0] == "diagnoser_signal" and ("signal", "not_a_signal") in k[1] for k in s)
    assert not any(k[0] == "diagnoser_signal" and ("signal", "queue_reqs") in k[1] for k in s)  # NaN is not exported
    assert s[("diagnoser_pool_capacity_tokens", (("engine", "sglang"), ("target", "http://a:30000")))] == 2048.0
    assert s[("diagnoser_suggestion_info", (("current", "2048"), ("engine", "sglang"), ("flag", "--max-total-tokens"), ("proposed", "16384"), ("rule", "kv_saturation"), ("target", "http://a:30000")))] == 1.0
    key = (("engine", "sglang"), ("flag", "--max-total-tokens"), ("rule", "kv_saturation"), ("target", "http://a:30000"))
    assert s[("diagnoser_suggestion_projected_running_reqs", key)] == 40.0
    assert s[("diagnoser_suggestion_projected_gen_throughput_tps", key)] == 3789.0
    assert s[("diagnoser_scrape_up", (("engine", "vllm"), ("target", "http://b:30000")))] == 0.0
    assert s[("diagnoser_scrape_errors_total", (("engine", "vllm"), ("target", "http://b:30000")))] == 3.0
    assert s[("diagnoser_rule_pass_duration_seconds", ())] == 0.003
    # resolve: the series disappears on the next scrape (no stale gauge left at 1)
    holder["snap"] = _snap([])
    text2 = render(reg).decode()
    assert "diagnoser_finding_active{" not in text2 and "diagnoser_suggestion_info{" not in text2


def test_promtool_check_metrics_is_clean() -> None:
    promtool = need_binary("promtool")
    text = render(make_registry(lambda: _snap([_kv()])))
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_projection_keys() -> None:
    assert projected({"projected_running": 12, "max_concurrent_requests": 46}, "running_reqs") == 12.0
    assert projected({"max_concurrent_requests": 11, "projected_gen_throughput_tps": 2346.0}, "gen_throughput_tps") == 2346.0
    assert projected({"after": {"running_reqs": 9}}, "running_reqs") == 9.0
    assert projected({"projected_running_reqs": float("inf")}, "running_reqs") is None
    assert projected(None, "running_reqs") is None
