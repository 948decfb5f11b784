"""Prometheus alerting rules generated from the rule catalogue (one source of truth).

``python -m diagnoser.outputs.promgen`` rewrites the committed files under ``rules/`` and
``dashboards/``; ``--check`` exits 1 when a committed file differs from what the catalogue gives
(tests/test_alert_rules.py runs the same check). Three kinds come out:

- ``diagnoser``: one alert per rule in ``diagnoser.rules.REGISTRY`` on the exporter's
  ``diagnoser_finding_active{rule,severity,target}`` gauge, plus alerts on the exporter's own health;
- ``sglang``: direct alerts on raw SGLang series for teams that run no diagnoser. Every selector takes
  both the ``sglang:`` and the ``sglang_`` spelling (docs/sglang.md#spelling, the colon-to-underscore trap);
- ``vllm``: the same for raw vLLM series (``vllm:``/``vllm_``, V0 and V1 names; docs/vllm.md#metrics), with
  the advice in vLLM's flags.

The YAML is written by a small emitter (every scalar is a JSON string, which YAML reads as a
double-quoted scalar), so generating needs no YAML library at run time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from diagnoser.rules import REGISTRY, Rule, by_name
from diagnoser.timeline import SIGNALS

RUNBOOK_BASE = "http://localhost:8000/rules/"  # `diagnose serve` rule-doc pages (/rules/<name>)
ALERT_PREFIX = "Diagnoser"
# signals quoted in every finding alert's description besides the rule's own `needs`
CONTEXT_SIGNALS = ("running_reqs", "queue_reqs")
MAX_QUOTED = 4

# raw SGLang alerts: grouping keeps DP ranks apart and folds TP/PP/CP ranks (which repeat the value)
RAW_BY = "job, instance, model_name, dp_rank"
KV_USAGE_HIGH = 0.9
RAW_WINDOW = "5m"


def runbook(base: str, rule: str) -> str:
    """The rule's doc page when the catalogue has that rule, else the rule index."""
    return f"{base}{rule}" if by_name(rule) is not None else base.rstrip("/")


def sg(metric: str, extra: str = "") -> str:
    """A selector that matches both spellings of an SGLang metric: ``{__name__=~"sglang[:_]NAME"}``."""
    sel = f'__name__=~"sglang[:_]{metric}"'
    return "{" + sel + (", " + extra if extra else "") + "}"


def alert_name(rule: type[Rule]) -> str:
    return ALERT_PREFIX + rule.__name__


def duration(seconds: float) -> str:
    """Prometheus duration text for whole seconds: 60 -> 1m, 90 -> 1m30s, 0 -> 0s."""
    s = int(round(seconds))
    if s <= 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts)


def parse_duration(text: str) -> float:
    total = 0.0
    for num, unit in re.findall(r"(\d+)(ms|s|m|h|d)", text):
        total += int(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return total


def rule_for_seconds(rule: type[Rule]) -> float:
    """The alert's ``for``: the rule's own live hold time, at least one minute (whole minutes)."""
    return max(60.0, math.ceil(float(getattr(rule, "for_seconds", 60.0)) / 60.0) * 60.0)


def quoted_signals(rule: type[Rule]) -> list[str]:
    """Signals a finding alert quotes: the rule's ``needs``, then canonical signals its doc names under Evidence
    or What it detects (in the order named), then running/queued requests for context."""
    sections = rule.doc_sections()
    evidence = sections.get("Evidence", "") + "\n" + sections.get("What it detects", "")
    named = sorted((m.start(), s) for s in SIGNALS if (m := re.search(rf"(?<![\w.]){re.escape(s)}(?![\w\[])", evidence)))
    out: list[str] = []
    for s in (*rule.needs, *(s for _, s in named), *CONTEXT_SIGNALS):
        if s not in out:
            out.append(s)
    return out[:MAX_QUOTED]


def first_line(rule: type[Rule]) -> str:
    """The rule's one-line doc, in Markdown as the rule docs are (code spans in single backticks)."""
    return rule.summary_line().replace("``", "`")


def _signal_template(signal: str) -> str:
    q = f'diagnoser_signal{{target="%s",signal="{signal}"}}'
    return (
        f"{{{{ with printf `{q}` $labels.target | query }}}}"
        f" {signal}={{{{ . | first | value | printf \"%.4g\" }}}}{{{{ end }}}}"
    )


def finding_alert(rule: type[Rule], for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    signals = "".join(_signal_template(s) for s in quoted_signals(rule))
    return {
        "alert": alert_name(rule),
        "expr": f'max by (target, rule) (diagnoser_finding_active{{rule="{rule.name}"}}) > 0',
        "for": for_override or duration(rule_for_seconds(rule)),
        "labels": {"severity": rule.severity.label, "rule": rule.name, "rule_code": rule.code},
        "annotations": {
            "summary": f"{rule.code} {rule.title or rule.name} on {{{{ $labels.target }}}}",
            "description": (
                f"{first_line(rule)} diagnoser has reported {rule.name} on {{{{ $labels.target }}}} since the"
                f" alert went pending. Now:{signals}. Run `diagnose explain {rule.name}` or open the runbook for"
                " the evidence and the flag changes."
            ),
            "runbook_url": f"{runbook_base}{rule.name}",
        },
    }


def exporter_alerts(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    return [
        {
            "alert": "DiagnoserTargetScrapeFailing",
            "expr": "max by (target) (diagnoser_scrape_up) == 0",
            "for": for_override or "2m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "diagnoser cannot scrape {{ $labels.target }}",
                "description": (
                    "diagnoser's last scrapes of {{ $labels.target }}/metrics failed for 2 minutes, so its"
                    " findings for that target are stale. Check that SGLang runs with --enable-metrics and"
                    " that the URL given to `diagnose serve --url` is reachable."
                ),
                "runbook_url": runbook(runbook_base, "source_unreachable"),
            },
        },
        {
            "alert": "DiagnoserExporterDown",
            "expr": 'up{job="diagnoser"} == 0',
            "for": for_override or "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "diagnoser's /metrics on {{ $labels.instance }} is down",
                "description": (
                    "Prometheus could not scrape diagnoser at {{ $labels.instance }} for 5 minutes, so no"
                    " finding alert can fire. Restart `diagnose serve` or fix the scrape target."
                ),
                "runbook_url": runbook_base.rstrip("/"),
            },
        },
    ]


def sglang_alerts(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    w = RAW_WINDOW
    usage = f"max_over_time((max by ({RAW_BY}) ({sg('token_usage')}))[{w}:])"
    queue = f"avg_over_time((max by ({RAW_BY}) ({sg('num_queue_reqs')}))[{w}:])"
    retracted = (
        f"sum by ({RAW_BY}) (increase({sg('num_retracted_requests_total')}[{w}])) > 0\n"
        f"or\nsum by ({RAW_BY}) (max_over_time({sg('num_retracted_reqs')}[{w}])) > 0\n"
        f"or\nsum by ({RAW_BY}) (delta({sg('total_retracted_reqs')}[{w}])) > 0"
    )
    where = "{{ $labels.instance }} ({{ $labels.model_name }}{{ if $labels.dp_rank }}, DP rank {{ $labels.dp_rank }}{{ end }})"
    return [
        {
            "alert": "SGLangKVPoolFullWithQueue",
            "expr": f"{usage} >= {KV_USAGE_HIGH}\nand on ({RAW_BY})\n{queue} >= 1",
            "for": for_override or "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"SGLang KV pool near full while requests wait on {where}",
                "description": (
                    f"KV token usage on {where} peaked at {{{{ $value | humanizePercentage }}}} in the last {w}"
                    " while on average at least one request waited in the queue. The pool, not compute,"
                    " caps the batch: raise --mem-fraction-static (keep 5-8 GB free) or use"
                    " --kv-cache-dtype fp8_e4m3. Usage above 0.9 with an empty queue is healthy."
                ),
                "runbook_url": runbook(runbook_base, "kv_saturation"),
            },
        },
        {
            "alert": "SGLangRetractionsRising",
            "expr": retracted,
            "for": for_override or "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"SGLang keeps retracting requests on {where}",
                "description": (
                    f"{{{{ $value | printf \"%.0f\" }}}} requests were retracted on {where} in the last {w}"
                    f" (KV cache pool full), and retractions went on for the whole alert window. Retracted"
                    " requests are recomputed, so throughput drops and tail latency rises. Raise"
                    " --schedule-conservativeness, lower --max-running-requests, or grow the KV pool."
                ),
                "runbook_url": runbook(runbook_base, "kv_saturation"),
            },
        },
        {
            "alert": "SGLangMetricsEndpointDown",
            "expr": 'up{job=~".*sglang.*"} == 0',
            "for": for_override or "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "SGLang /metrics on {{ $labels.instance }} is down",
                "description": (
                    "Prometheus could not scrape {{ $labels.instance }} (job {{ $labels.job }}) for 2"
                    " minutes: the server is down, overloaded, or runs without --enable-metrics (then"
                    " /metrics answers 404)."
                ),
                "runbook_url": runbook_base.rstrip("/"),
            },
        },
    ]


# raw vLLM alerts (docs/vllm.md#metrics): both spellings, the V0 and V1 names of a renamed series in one regex,
# grouped per V1 data-parallel engine (the ``engine`` label; V0 series have none)
VLLM_BY = "job, instance, model_name, engine"


def vl(names: str, extra: str = "") -> str:
    """A selector over both spellings and every name of a vLLM series: ``{__name__=~"vllm[:_]NAMES"}``."""
    sel = f'__name__=~"vllm[:_]{names}"'
    return "{" + sel + (", " + extra if extra else "") + "}"


def vllm_alerts(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    w = RAW_WINDOW
    usage = f"max_over_time((max by ({VLLM_BY}) ({vl('(kv|gpu)_cache_usage_perc')}))[{w}:])"
    waiting = f"avg_over_time((max by ({VLLM_BY}) ({vl('num_requests_waiting')}))[{w}:])"
    preempted = f"sum by ({VLLM_BY}) (increase({vl('num_preemptions_total')}[{w}])) > 0"
    where = "{{ $labels.instance }} ({{ $labels.model_name }}{{ if $labels.engine }}, engine {{ $labels.engine }}{{ end }})"
    return [
        {
            "alert": "VLLMKVCacheFullWithWaiting",
            "expr": f"{usage} >= {KV_USAGE_HIGH}\nand on ({VLLM_BY})\n{waiting} >= 1",
            "for": for_override or "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"vLLM KV cache near full while requests wait on {where}",
                "description": (
                    f"KV cache usage on {where} peaked at {{{{ $value | humanizePercentage }}}} in the last {w}"
                    " while on average at least one request waited. The KV blocks, not compute, cap the batch:"
                    " raise --gpu-memory-utilization (the share of the whole GPU for weights, activations and KV),"
                    " use --kv-cache-dtype fp8, or lower --max-model-len. Usage above 0.9 with nothing waiting is healthy."
                ),
                "runbook_url": runbook(runbook_base, "kv_saturation"),
            },
        },
        {
            "alert": "VLLMPreemptionsRising",
            "expr": preempted,
            "for": for_override or "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"vLLM keeps preempting requests on {where}",
                "description": (
                    f"{{{{ $value | printf \"%.0f\" }}}} requests were preempted on {where} in the last {w}"
                    " (KV cache full), and preemptions went on for the whole alert window. A preempted request"
                    " is recomputed (or swapped back on V0), so throughput drops and tail latency rises. Lower"
                    " --max-num-seqs or --max-num-batched-tokens, or grow the KV cache (--gpu-memory-utilization,"
                    " --kv-cache-dtype fp8)."
                ),
                "runbook_url": runbook(runbook_base, "kv_retraction"),
            },
        },
        {
            "alert": "VLLMMetricsEndpointDown",
            "expr": 'up{job=~".*vllm.*"} == 0',
            "for": for_override or "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "vLLM /metrics on {{ $labels.instance }} is down",
                "description": (
                    "Prometheus could not scrape {{ $labels.instance }} (job {{ $labels.job }}) for 2"
                    " minutes: the server is down, still starting (loading weights, compiling), or overloaded."
                ),
                "runbook_url": runbook_base.rstrip("/"),
            },
        },
    ]


def vllm_rule_file(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    return {"groups": [{"name": "vllm-direct", "rules": vllm_alerts(for_override, runbook_base)}]}


def diagnoser_rule_file(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    findings = [finding_alert(r, for_override, runbook_base) for r in REGISTRY]
    return {
        "groups": [
            {"name": "diagnoser-findings", "rules": findings},
            {"name": "diagnoser-exporter", "rules": exporter_alerts(for_override, runbook_base)},
        ]
    }


def sglang_rule_file(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    return {"groups": [{"name": "sglang-direct", "rules": sglang_alerts(for_override, runbook_base)}]}


# -- promtool unit tests for the finding alerts ------------------------------------------------------
TEST_TARGET = "http://sglang:30000"
TEST_SIGNAL_VALUES = {"token_usage": 0.97, "queue_reqs": 33.0, "running_reqs": 7.0}
TEST_STEP = 15


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def expected_description(rule: type[Rule], target: str, values: dict[str, float]) -> str:
    now = "".join(f" {s}={_fmt(values[s])}" for s in quoted_signals(rule) if s in values)
    return (
        f"{first_line(rule)} diagnoser has reported {rule.name} on {target} since the alert went pending."
        f" Now:{now}. Run `diagnose explain {rule.name}` or open the runbook for the evidence and the flag changes."
    )


def _test_value(signal: str, i: int) -> float:
    return TEST_SIGNAL_VALUES.get(signal, round(1.5 + i, 2))


def finding_tests(runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    """One promtool test per rule: silent one step before ``for``, firing with rendered annotations at it."""
    tests = []
    for rule in REGISTRY:
        fs = int(rule_for_seconds(rule))
        steps = fs // TEST_STEP + 4
        values = {s: _test_value(s, i) for i, s in enumerate(quoted_signals(rule))}
        series = [
            {
                "series": f'diagnoser_finding_active{{rule="{rule.name}",severity="{rule.severity.label}",target="{TEST_TARGET}"}}',
                "values": f"1x{steps}",
            },
            # another rule's finding on the same target must not fire this alert
            {"series": f'diagnoser_finding_active{{rule="not_{rule.name}",severity="critical",target="{TEST_TARGET}"}}', "values": f"1x{steps}"},
        ]
        series += [
            {"series": f'diagnoser_signal{{signal="{s}",target="{TEST_TARGET}"}}', "values": f"{_fmt(v)}x{steps}"}
            for s, v in values.items()
        ]
        alert = alert_name(rule)
        firing = {
            "exp_labels": {"severity": rule.severity.label, "rule": rule.name, "rule_code": rule.code, "target": TEST_TARGET},
            "exp_annotations": {
                "summary": f"{rule.code} {rule.title or rule.name} on {TEST_TARGET}",
                "description": expected_description(rule, TEST_TARGET, values),
                "runbook_url": f"{runbook_base}{rule.name}",
            },
        }
        tests.append(
            {
                "name": f"{rule.code} {rule.name}: for {duration(fs)} boundary and annotations",
                "interval": f"{TEST_STEP}s",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": duration(fs - TEST_STEP), "alertname": alert, "exp_alerts": []},
                    {"eval_time": duration(fs), "alertname": alert, "exp_alerts": [firing]},
                ],
            }
        )
    return {"rule_files": ["../diagnoser-alerts.yml"], "evaluation_interval": f"{TEST_STEP}s", "tests": tests}


# -- YAML emitter --------------------------------------------------------------------------------------
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    if v is None:
        return "null"
    return json.dumps(str(v), ensure_ascii=False)


def _block_ok(s: str) -> bool:
    return "\n" in s and not s.endswith("\n") and all(line == line.rstrip() and not line.startswith(" ") for line in s.split("\n")) and "\t" not in s


def _lines(obj: Any, indent: int) -> Iterable[str]:
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            yield pad + "{}"
        for k, v in obj.items():
            key = k if _PLAIN_KEY.match(k) else json.dumps(k)
            if isinstance(v, dict | list) and v:
                yield f"{pad}{key}:"
                yield from _lines(v, indent + 2)
            elif isinstance(v, str) and _block_ok(v):
                yield f"{pad}{key}: |-"
                yield from (f"{pad}  {line}" for line in v.split("\n"))
            else:
                yield f"{pad}{key}: {_scalar(v) if not isinstance(v, dict | list) else ('{}' if isinstance(v, dict) else '[]')}"
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, dict | list) and item:
                sub = list(_lines(item, indent + 2))
                yield f"{pad}- " + sub[0][indent + 2 :]
                yield from sub[1:]
            else:
                yield f"{pad}- {_scalar(item) if not isinstance(item, dict | list) else ('{}' if isinstance(item, dict) else '[]')}"
    else:
        yield pad + _scalar(obj)


def to_yaml(obj: Any, header: str = "") -> str:
    head = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return head + "\n".join(_lines(obj, 0)) + "\n"


GENERATED = "Generated by `python -m diagnoser.outputs.promgen` from diagnoser.rules.REGISTRY; do not edit."


def rendered_files(for_override: str | None = None, runbook_base: str = RUNBOOK_BASE) -> dict[str, str]:
    """Relative path -> content of every generated file (rules and dashboards)."""
    from diagnoser.outputs import grafana

    files = {
        "rules/diagnoser-alerts.yml": to_yaml(diagnoser_rule_file(for_override, runbook_base), GENERATED),
        "rules/sglang-alerts.yml": to_yaml(sglang_rule_file(for_override, runbook_base), GENERATED),
        "rules/vllm-alerts.yml": to_yaml(vllm_rule_file(for_override, runbook_base), GENERATED),
        "rules/tests/diagnoser-alerts.test.yml": to_yaml(finding_tests(runbook_base), GENERATED),
    }
    files.update(grafana.rendered_dashboards())
    return files


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m diagnoser.outputs.promgen", description="Write rules/ and dashboards/ from the rule catalogue.")
    p.add_argument("--root", default=".", help="repository root to write into (default: .)")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when a file is stale")
    args = p.parse_args(argv)
    root = Path(args.root)
    stale = []
    for rel, text in rendered_files().items():
        path = root / rel
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(rel)
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {rel}")
        except OSError as e:
            print(f"promgen: cannot write {path} ({e.strerror or e}); pass --root with a writable checkout.", file=sys.stderr)
            return 2
    if stale:
        print("stale generated files (run `python -m diagnoser.outputs.promgen`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
