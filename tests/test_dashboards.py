"""Grafana dashboards in dashboards/: structure, datasource as a variable, both spellings, and every
expr parsed by the real promtool (Grafana itself is not installable here; see testing-tools.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from diagnoser.outputs import grafana
from tests.conftest import ROOT
from tests.stack_support import DASHBOARD_FILES, dashboard_exprs, need_bin, run, substitute

DS_VAR = {"type": "prometheus", "uid": "${datasource}"}
EXPORTED = {  # the exporter's fixed names (issue 5); a dashboard may query no other diagnoser_ name
    "diagnoser_finding_active", "diagnoser_signal", "diagnoser_pool_capacity_tokens", "diagnoser_suggestion_info",
    "diagnoser_suggestion_projected_running_reqs", "diagnoser_suggestion_projected_gen_throughput_tps",
    "diagnoser_scrape_up", "diagnoser_scrape_duration_seconds", "diagnoser_scrape_errors_total",
    "diagnoser_rule_pass_duration_seconds",
}


def load(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "dashboards" / name).read_text())


@pytest.fixture(params=[p.name for p in DASHBOARD_FILES])
def dash(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def test_the_dashboards_exist() -> None:
    assert {p.name for p in DASHBOARD_FILES} == {"sglang-overview.json", "vllm-overview.json", "diagnoser-findings.json"}
    assert {load(p.name)["title"] for p in DASHBOARD_FILES} == {"SGLang overview", "vLLM overview", "diagnoser findings"}


def test_vllm_overview_covers_the_signals_with_both_spellings_and_names() -> None:
    d = load("vllm-overview.json")
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "instance", "model", "engine"} <= names
    exprs = " ".join(e for _, e in dashboard_exprs(d))
    for metric in ("(kv|gpu)_cache_usage_perc", "num_requests_running", "num_requests_waiting", "generation_tokens_total",
                   "prompt_tokens_total", "avg_generation_throughput_toks_per_s", "num_preemptions_total",
                   "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                   "time_per_output_token_seconds_bucket", "(gpu_)?prefix_cache_hits(_total)?", "gpu_prefix_cache_hit_rate",
                   "request_queue_time_seconds_bucket", "request_success_total", "cache_config_info"):
        assert f'vllm[:_]{metric}"' in exprs, metric
    assert "sglang" not in exprs.replace("sglang-overview", "")
    assert not re.search(r'"vllm:|"vllm_', exprs), "single-spelling selector"
    for _, e in dashboard_exprs(d):
        if "vllm[:_]" in e and "label_values" not in e and not e.startswith("{") and "cache_config_info" not in e:
            assert 'instance=~"$instance"' in e and 'model_name=~"$model"' in e, e
    per_engine = [e for _, e in dashboard_exprs(d) if 'engine=~"$engine"' in e]
    assert len(per_engine) >= 8, "V1's data-parallel engines must stay apart"
    found = [e for _, e in dashboard_exprs(d) if "diagnoser_" in e]
    assert found and all('engine="vllm"' in e for e in found), found
    used = set(re.findall(r"\bdiagnoser_[a-z_]+", exprs))
    assert used <= EXPORTED, used - EXPORTED


def test_datasource_is_a_variable_never_a_fixed_uid(dash: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    uids: list[str] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            if isinstance(o.get("datasource"), dict):
                uids.append(o["datasource"].get("uid"))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk({k: v for k, v in dash.items() if k != "uid"})
    assert uids and set(uids) <= {"${datasource}", "-- Grafana --"}, set(uids)


def test_every_panel_has_description_datasource_and_targets(dash: dict[str, Any]) -> None:
    assert len(dash["panels"]) >= 6
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert len(p.get("description", "")) > 40, f"panel {p['title']!r} lacks a description"
        assert p["datasource"] == DS_VAR
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"] == DS_VAR and t["expr"].strip()


def test_annotations_mark_findings(dash: dict[str, Any]) -> None:
    anns = [a for a in dash["annotations"]["list"] if a.get("expr")]
    assert any("diagnoser_finding_active" in a["expr"] for a in anns)
    for a in anns:
        assert a["datasource"] == DS_VAR and a.get("titleFormat")


def test_sglang_overview_covers_the_signals_with_both_spellings() -> None:
    d = load("sglang-overview.json")
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "instance", "model", "dp_rank"} <= names
    exprs = " ".join(e for _, e in dashboard_exprs(d))
    for metric in ("token_usage", "num_running_reqs", "num_queue_reqs", "gen_throughput", "realtime_tokens_total",
                   "prompt_tokens_total", "num_retracted_requests_total", "time_to_first_token_seconds_bucket",
                   "inter_token_latency_seconds_bucket", "cache_hit_rate", "cached_tokens_total"):
        assert f'sglang[:_]{metric}"' in exprs, metric
    # no selector takes only one spelling
    assert not re.search(r"sglang[:_](?!\])\w", exprs.replace("sglang[:_]", "")), "single-spelling selector"
    for _, e in dashboard_exprs(d):
        if "sglang[:_]" in e and "label_values" not in e and not e.startswith("{"):
            assert "instance=~\"$instance\"" in e and "model_name=~\"$model\"" in e, e
    per_rank = [e for _, e in dashboard_exprs(d) if "dp_rank" in e]
    assert len(per_rank) >= 6, "gauges must keep DP ranks apart"


def test_findings_dashboard_panels() -> None:
    d = load("diagnoser-findings.json")
    kinds = {p["title"]: p["type"] for p in d["panels"]}
    assert kinds["Findings over time"] == "state-timeline"
    exprs = " ".join(e for _, e in dashboard_exprs(d))
    for name in ("diagnoser_finding_active", "diagnoser_suggestion_info", "diagnoser_suggestion_projected_gen_throughput_tps",
                 "diagnoser_suggestion_projected_running_reqs", "diagnoser_pool_capacity_tokens", "diagnoser_scrape_up"):
        assert name in exprs, name
    used = set(re.findall(r"\bdiagnoser_[a-z_]+", exprs))
    assert used <= EXPORTED, used - EXPORTED


def test_committed_json_matches_the_builder() -> None:
    for rel, text in grafana.rendered_dashboards().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run python -m diagnoser.outputs.promgen"


def _promtool_check(exprs: list[tuple[str, str]], tmp_path: Path) -> tuple[int, str]:
    rules = [{"record": f"check:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "exprs.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard-exprs", "rules": rules}]}, indent=1))
    r = run([need_bin("promtool"), "check", "rules", str(path)])
    return r.returncode, r.stdout + r.stderr


@pytest.mark.prometheus
def test_every_dashboard_expr_parses_under_promtool(dash: dict[str, Any], tmp_path: Path) -> None:
    exprs = dashboard_exprs(dash)
    assert len(exprs) >= 10
    rc, out = _promtool_check(exprs, tmp_path)
    assert rc == 0, out
    assert f"SUCCESS: {len(exprs)} rules found" in out


@pytest.mark.prometheus
def test_promtool_check_rejects_a_broken_expr(tmp_path: Path) -> None:
    rc, out = _promtool_check([("broken", 'sum by (le (rate({__name__=~"sglang[:_]x"}[$__rate_interval]))')], tmp_path)
    assert rc != 0 and "parse error" in out.lower()


@pytest.mark.prometheus
def test_overview_falls_back_to_older_sglang_names(tmp_path: Path) -> None:
    """Retractions and ITL panels still draw for servers older than the names the e2e data has (0.4.x),
    evaluated by promtool on series named as those versions name them (docs/sglang.md#metrics-requests, #metric-renames)."""
    d = load("sglang-overview.json")
    expr = {(p["title"], t["refId"]): substitute(t["expr"]) for p in d["panels"] for t in p["targets"]}
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'sglang:total_retracted_reqs{instance="a",model_name="m",tp_rank="0"}', "values": "0+3x10"},
                {"series": 'sglang:time_per_output_token_seconds_bucket{instance="a",model_name="m",le="0.01"}', "values": "0+10x10"},
                {"series": 'sglang:time_per_output_token_seconds_bucket{instance="a",model_name="m",le="0.02"}', "values": "0+20x10"},
                {"series": 'sglang:time_per_output_token_seconds_bucket{instance="a",model_name="m",le="+Inf"}', "values": "0+20x10"},
            ],
            "promql_expr_test": [
                {"expr": expr[("Retractions", "A")], "eval_time": "5m",
                 "exp_samples": [{"labels": '{instance="a",model_name="m"}', "value": 3}]},
                {"expr": expr[("Inter-token latency", "B")], "eval_time": "5m",  # p90 inside the 0.01-0.02 bucket
                 "exp_samples": [{"labels": '{instance="a",model_name="m"}', "value": 0.018000000000000002}]},  # 0.01 + 0.01 * 8/10 in IEEE doubles
            ],
        }],
    }
    path = tmp_path / "fallback.test.yml"
    path.write_text(json.dumps(test))
    r = run([need_bin("promtool"), "test", "rules", path.name], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def _denominators(expr: str) -> list[str]:
    """The right operand of every ``/`` in an expr (after its vector matching), as written."""
    e = _strip_strings(expr)
    out = []
    for m in re.finditer(r"/\s*(?:(?:on|ignoring)\s*\([^)]*\)\s*(?:group_(?:left|right)(?:\s*\([^)]*\))?)?\s*)?", e):
        rest = e[m.end():]
        if not rest.startswith("("):
            out.append(rest[:60])
            continue
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                out.append(rest[: i + 1])
                break
    return out


def test_no_division_can_reach_inf(dash: dict[str, Any]) -> None:
    """Every division's denominator keeps only samples above 0, so a zero leaves a gap, never ±Inf or NaN."""
    divisions = 0
    for label, expr in dashboard_exprs(dash):
        for den in _denominators(expr):
            divisions += 1
            assert re.search(r">\s*0\s*\)$", den), f"{label}: the denominator {den!r} can be 0 (use grafana.ratio)"
    assert divisions >= 1
    assert _denominators('a / b') == ["b"] and _denominators('a / on (t) group_left () (b > 0)') == ["(b > 0)"]


@pytest.mark.prometheus
def test_divisions_leave_a_gap_when_the_denominator_is_zero(tmp_path: Path) -> None:
    """The real promtool evaluates the findings dashboard's "throughput gain (x)" and the overview's window
    cache hit rate: a 0 denominator gives no sample (the issue: +Inf when the last gen throughput was 0), a
    positive one the ratio."""
    find = {(p["title"], t["refId"]): substitute(t["expr"]) for p in load("diagnoser-findings.json")["panels"] for t in p["targets"]}
    over = {(p["title"], t["refId"]): substitute(t["expr"]) for p in load("sglang-overview.json")["panels"] for t in p["targets"]}
    gain = find[("Current suggestions and projected gains", "D")]
    hit = over[("Prefix cache hit rate", "B")]
    proj = 'diagnoser_suggestion_projected_gen_throughput_tps{target="%s",rule="kv_saturation",flag="--max-total-tokens"}'
    sig = 'diagnoser_signal{target="%s",signal="gen_throughput_tps"}'
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": proj % "idle", "values": "4000x10"}, {"series": sig % "idle", "values": "0x10"},
                {"series": proj % "busy", "values": "4000x10"}, {"series": sig % "busy", "values": "1600x10"},
                {"series": 'sglang:cached_tokens_total{instance="a",model_name="m"}', "values": "100x10"},
                {"series": 'sglang:prompt_tokens_total{instance="a",model_name="m"}', "values": "400x10"},  # no prompt in the interval
                {"series": 'sglang:cached_tokens_total{instance="b",model_name="m"}', "values": "0+30x10"},
                {"series": 'sglang:prompt_tokens_total{instance="b",model_name="m"}', "values": "0+120x10"},
            ],
            "promql_expr_test": [
                {"expr": gain, "eval_time": "5m",
                 "exp_samples": [{"labels": '{target="busy",rule="kv_saturation",flag="--max-total-tokens"}', "value": 2.5}]},
                {"expr": hit, "eval_time": "5m", "exp_samples": [{"labels": '{instance="b",model_name="m"}', "value": 0.25}]},
            ],
        }],
    }
    path = tmp_path / "ratios.test.yml"
    path.write_text(json.dumps(test))
    r = run([need_bin("promtool"), "test", "rules", path.name], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.prometheus
def test_vllm_overview_reads_v0_names_and_both_spellings(tmp_path: Path) -> None:
    """The vLLM panels on the names older releases export (docs/vllm.md#metrics): gpu_cache_usage_perc (before
    0.10), time_per_output_token_seconds (before 0.8.6), the V0 logger's avg_generation_throughput_toks_per_s
    gauge (0.2.7-0.6.6) and gpu_prefix_cache_hit_rate (V0, 0.6.6-0.8.5), stored as ``vllm_`` after a hop; and
    the current V1 names as ``vllm:``. A zero prefix-cache denominator leaves a gap."""
    d = load("vllm-overview.json")
    expr = {(p["title"], t["refId"]): substitute(t["expr"]) for p in d["panels"] for t in p["targets"]}
    v0 = 'instance="old",model_name="m"'
    v1 = 'instance="new",model_name="m",engine="0"'
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f"vllm_gpu_cache_usage_perc{{{v0}}}", "values": "0.5x10"},
                {"series": f"vllm:kv_cache_usage_perc{{{v1}}}", "values": "0.97x10"},
                {"series": f"vllm_avg_generation_throughput_toks_per_s{{{v0}}}", "values": "123x10"},
                {"series": f"vllm:generation_tokens_total{{{v1}}}", "values": "0+600x10"},
                {"series": f'vllm_time_per_output_token_seconds_bucket{{{v0},le="0.01"}}', "values": "0+10x10"},
                {"series": f'vllm_time_per_output_token_seconds_bucket{{{v0},le="0.02"}}', "values": "0+20x10"},
                {"series": f'vllm_time_per_output_token_seconds_bucket{{{v0},le="+Inf"}}', "values": "0+20x10"},
                {"series": f"vllm_gpu_prefix_cache_hit_rate{{{v0}}}", "values": "0.4x10"},
                {"series": f"vllm:prefix_cache_hits_total{{{v1}}}", "values": "0+30x10"},
                {"series": f"vllm:prefix_cache_queries_total{{{v1}}}", "values": "0+120x10"},
                {"series": 'vllm:prefix_cache_hits_total{instance="idle",model_name="m",engine="0"}', "values": "5x10"},
                {"series": 'vllm:prefix_cache_queries_total{instance="idle",model_name="m",engine="0"}', "values": "9x10"},
            ],
            "promql_expr_test": [
                {"expr": expr[("KV cache usage", "A")], "eval_time": "5m",
                 "exp_samples": [{"labels": '{instance="old",model_name="m"}', "value": 0.5},
                                 {"labels": '{instance="new",model_name="m",engine="0"}', "value": 0.97}]},
                {"expr": expr[("Token throughput", "A")], "eval_time": "5m",
                 "exp_samples": [{"labels": '{instance="new",model_name="m",engine="0"}', "value": 10},
                                 {"labels": '{instance="old",model_name="m"}', "value": 123}]},
                {"expr": expr[("Inter-token latency", "B")], "eval_time": "5m",  # p90 inside the 0.01-0.02 bucket
                 "exp_samples": [{"labels": '{instance="old",model_name="m"}', "value": 0.018000000000000002}]},
                {"expr": expr[("Prefix cache hit rate", "A")], "eval_time": "5m",
                 "exp_samples": [{"labels": '{instance="new",model_name="m",engine="0"}', "value": 0.25},
                                 {"labels": '{instance="old",model_name="m"}', "value": 0.4}]},
            ],
        }],
    }
    path = tmp_path / "vllm.test.yml"
    path.write_text(json.dumps(test))
    r = run([need_bin("promtool"), "test", "rules", path.name], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
