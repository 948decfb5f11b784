"""``diagnose rules`` (the catalogue) and ``diagnose explain RULE`` (one rule's doc)."""

from __future__ import annotations

import json
import sys

from diagnoser.cli import UsageError
from diagnoser.rules import REGISTRY, by_name


def main(cmd: str, argv: list[str]) -> int:
    as_json = "--format" in argv and "json" in argv
    argv = [a for a in argv if a not in ("--format", "json", "text")]
    if cmd == "rules":
        if as_json:
            rows = [{"name": r.name, "code": r.code, "severity": r.severity.label, "summary": r.summary_line(), "thresholds": r.defaults} for r in REGISTRY]
            print(json.dumps(rows, indent=2))
            return 0
        width = max(len(r.name) for r in REGISTRY)
        for r in REGISTRY:
            print(f"{r.code}  {r.name.ljust(width)}  {r.severity.label:<8}  {r.summary_line()}"[:160])
        return 0
    if not argv:
        raise UsageError("explain needs a rule name, e.g. 'diagnose explain kv_saturation'; 'diagnose rules' lists them")
    rule = by_name(argv[0])
    if rule is None:
        raise UsageError(f"no rule named {argv[0]!r}; 'diagnose rules' lists them")
    if as_json:
        print(json.dumps({"name": rule.name, "code": rule.code, "severity": rule.severity.label, "doc": rule.doc(), "sections": rule.doc_sections(), "thresholds": rule.defaults, "threshold_help": rule.threshold_help}, indent=2))
        return 0
    sys.stdout.write(f"{rule.code} {rule.name} ({rule.severity.label})\n\n{rule.doc()}\n")
    if rule.defaults:
        sys.stdout.write("\nThresholds (override with --set NAME.KEY=VALUE or [rules.NAME] in --config):\n")
        for k, v in rule.defaults.items():
            help_ = rule.threshold_help.get(k, "")
            sys.stdout.write(f"  {rule.name}.{k} = {v}   {help_}\n")
    return 0


def markdown() -> str:
    """The rule catalogue as Markdown (docs/rules.md is generated from this; a test keeps it current)."""
    out = ["# Rule catalogue", "", "Generated from the rules' own docs (`diagnoser/rules/`); regenerate with",
           "`python -c 'from diagnoser.cli.rules_cmd import markdown; print(markdown(), end=\"\")' > docs/rules.md`.", "",
           "| code | rule | severity | what it detects |", "|---|---|---|---|"]
    for r in REGISTRY:
        out.append(f"| {r.code} | [`{r.name}`](#{r.name}) | {r.severity.label} | {r.summary_line()} |")
    for r in REGISTRY:
        out += ["", f"## {r.name}", "", f"`{r.code}`, default severity {r.severity.label}.", "", r.doc()]
        if r.defaults:
            out += ["", "| threshold | default | meaning |", "|---|---|---|"]
            out += [f"| `{r.name}.{k}` | {v} | {r.threshold_help.get(k, '')} |" for k, v in r.defaults.items()]
    return "\n".join(out) + "\n"
