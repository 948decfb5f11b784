"""Prometheus alerting rules in rules/: generated from the rule catalogue, current, and proven by promtool.

promtool's own unit tests (rules/tests/*.test.yml) check each alert's `for` boundary and its rendered
annotations; the mutation tests below prove those unit tests can fail.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from diagnoser.outputs import promgen
from diagnoser.rules import REGISTRY
from tests.conftest import ROOT
from tests.stack_support import need_bin, run

RULES = ROOT / "rules"


def load(name: str) -> dict:
    return yaml.safe_load((RULES / name).read_text())


def alerts(name: str) -> dict[str, dict]:
    return {r["alert"]: r for g in load(name)["groups"] for r in g["rules"]}


def test_committed_files_are_current() -> None:
    """rules/ and dashboards/ are exactly what the catalogue generates (run the generator when this fails)."""
    stale = [rel for rel, text in promgen.rendered_files().items() if not (ROOT / rel).exists() or (ROOT / rel).read_text() != text]
    assert not stale, f"stale generated files, run `.venv/bin/python -m diagnoser.outputs.promgen`: {stale}"
    assert promgen.main(["--root", str(ROOT), "--check"]) == 0


def test_check_mode_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert promgen.main(["--root", str(tmp_path)]) == 0
    target = tmp_path / "rules" / "diagnoser-alerts.yml"
    target.write_text(target.read_text().replace("for: ", "for: 9"))
    assert promgen.main(["--root", str(tmp_path), "--check"]) == 1
    assert "rules/diagnoser-alerts.yml" in capsys.readouterr().err


def test_one_alert_per_rule_with_catalogue_severity_and_annotations() -> None:
    got = alerts("diagnoser-alerts.yml")
    for rule in REGISTRY:
        name = promgen.alert_name(rule)
        assert name in got, f"no alert for rule {rule.name}"
        a = got[name]
        assert a["expr"] == f'max by (target, rule) (diagnoser_finding_active{{rule="{rule.name}"}}) > 0'
        assert a["labels"]["severity"] == rule.severity.label
        assert a["labels"]["rule"] == rule.name and a["labels"]["rule_code"] == rule.code
        assert promgen.parse_duration(a["for"]) >= max(60.0, rule.for_seconds)
        ann = a["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}
        assert "{{ $labels.target }}" in ann["summary"]
        assert "diagnoser_signal" in ann["description"] and "| query" in ann["description"], "description quotes no values"
        assert ann["runbook_url"].endswith(f"/rules/{rule.name}")
    finding_alerts = [n for n, a in got.items() if "diagnoser_finding_active" in a["expr"]]
    assert len(finding_alerts) == len(REGISTRY)


def test_raw_sglang_alerts_take_both_spellings() -> None:
    got = alerts("sglang-alerts.yml")
    assert {"SGLangKVPoolFullWithQueue", "SGLangRetractionsRising", "SGLangMetricsEndpointDown"} <= set(got)
    for name, a in got.items():
        for m in re.finditer(r"sglang(.)\w+", a["expr"]):
            assert m.group(0).startswith("sglang[:_]") or m.group(1) == "[", f"{name}: one spelling only in {a['expr']!r}"
        assert a["labels"]["severity"] in ("info", "warning", "critical")
        assert a["annotations"]["description"] and a["annotations"]["runbook_url"].startswith("http")
    assert "{{ $value" in got["SGLangKVPoolFullWithQueue"]["annotations"]["description"]
    assert "{{ $value" in got["SGLangRetractionsRising"]["annotations"]["description"]


def test_raw_vllm_alerts_take_both_spellings_and_vllm_flags() -> None:
    got = alerts("vllm-alerts.yml")
    assert set(got) == {"VLLMKVCacheFullWithWaiting", "VLLMPreemptionsRising", "VLLMMetricsEndpointDown"}
    for name, a in got.items():
        if name == "VLLMMetricsEndpointDown":
            continue
        names = re.findall(r'__name__=~"([^"]+)"', a["expr"])
        assert names and all(n.startswith("vllm[:_]") for n in names), a["expr"]
        assert "engine" in a["expr"], "V1's data-parallel engines must stay apart"
        desc = a["annotations"]["description"]
        assert not re.search(r"--(mem-fraction-static|max-running-requests|schedule-conservativeness|max-total-tokens)", desc), desc
    assert "(kv|gpu)_cache_usage_perc" in got["VLLMKVCacheFullWithWaiting"]["expr"]


@pytest.mark.parametrize("obj", [
    {"a": 'quote " and \\ backslash', "b": "{{ $labels.x }} `q` %s", "c": ["x", {"k": "multi\nline {{ y }}"}]},
    {"expr": "max by (a) (x)\nand on (a)\ny", "n": 1.5, "t": True, "e": [], "d": {}, "u": "ünïcode ✓", "key with space": "v"},
])
def test_yaml_emitter_round_trips(obj: dict) -> None:
    assert yaml.safe_load(promgen.to_yaml(obj, "header\n\nline")) == obj


def test_duration_text() -> None:
    assert [promgen.duration(s) for s in (0, 45, 60, 90, 3600, 3725)] == ["0s", "45s", "1m", "1m30s", "1h", "1h2m5s"]
    assert promgen.parse_duration("1h2m5s") == 3725


@pytest.mark.prometheus
def test_promtool_check_rules() -> None:
    promtool = need_bin("promtool")
    files = sorted(str(p) for p in RULES.glob("*.yml"))
    assert len(files) >= 2
    r = run([promtool, "check", "rules", *files])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(files)


@pytest.mark.prometheus
def test_promtool_unit_tests_pass() -> None:
    promtool = need_bin("promtool")
    tests = sorted(p.name for p in (RULES / "tests").glob("*.test.yml"))
    assert {"diagnoser-alerts.test.yml", "diagnoser-exporter.test.yml", "sglang-alerts.test.yml", "vllm-alerts.test.yml"} <= set(tests)
    r = run([promtool, "test", "rules", *tests], cwd=RULES / "tests")
    assert r.returncode == 0, r.stdout + r.stderr
    # one generated test per catalogue rule
    gen = yaml.safe_load((RULES / "tests" / "diagnoser-alerts.test.yml").read_text())
    assert len(gen["tests"]) == len(REGISTRY)


def _mutated_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    dst = tmp_path / "rules"
    shutil.copytree(RULES, dst)
    path = dst / file
    text = path.read_text()
    assert old in text, f"{old!r} not in {file}"
    path.write_text(text.replace(old, new, 1))
    return dst / "tests"


@pytest.mark.prometheus
@pytest.mark.parametrize(("file", "old", "new"), [
    # the rule waits one step longer than the test expects: the `for` boundary check must catch it
    ("sglang-alerts.yml", 'for: "5m"', 'for: "5m15s"'),
    ("diagnoser-alerts.yml", 'for: "1m"', 'for: "1m15s"'),
    ("diagnoser-alerts.yml", 'for: "2m"', 'for: "2m30s"'),
    # a wrong rendered annotation must be caught
    ("sglang-alerts.yml", "peaked at", "peaks at"),
    ("tests/diagnoser-alerts.test.yml", "token_usage=0.97", "token_usage=0.98"),
    # the alert must not fire below the usage threshold
    ("tests/sglang-alerts.test.yml", "values: '0.95x12'", "values: '0.85x12'"),
    # the same for the vLLM alerts: the `for` boundary, an annotation, the threshold, and the V0 name
    ("vllm-alerts.yml", 'for: "5m"', 'for: "5m15s"'),
    ("vllm-alerts.yml", "raise --gpu-memory-utilization", "raise --gpu-memory-util"),
    ("tests/vllm-alerts.test.yml", "values: '0.95x12'", "values: '0.85x12'"),
    ("vllm-alerts.yml", "(kv|gpu)_cache_usage_perc", "kv_cache_usage_perc"),
    ("vllm-alerts.yml", "vllm[:_]num_preemptions_total", "vllm:num_preemptions_total"),
])
def test_promtool_unit_tests_can_fail(tmp_path: Path, file: str, old: str, new: str) -> None:
    promtool = need_bin("promtool")
    tests_dir = _mutated_copy(tmp_path, file, old, new)
    stem = Path(file).name.split("-")[0]  # the unit tests of the mutated file: sglang-*, vllm-* or diagnoser-*
    r = run([promtool, "test", "rules", *sorted(p.name for p in tests_dir.glob(f"{stem}-*.test.yml"))], cwd=tests_dir)
    assert r.returncode != 0, f"promtool passed after mutating {file}: {old!r} -> {new!r}"


def test_unwritable_root_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert promgen.main(["--root", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("promgen: cannot write") and "Traceback" not in err and err.count("\n") == 1
