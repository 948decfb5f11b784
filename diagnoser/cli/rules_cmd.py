"""``diagnose rules`` (the catalogue) and ``diagnose explain RULE`` (one rule's doc).

Rule docs are written in the Markdown subset of :mod:`diagnoser.outputs.docmd`; ``explain`` prints them as
plain text (no markup, re-wrapped to the terminal), ``docs/rules.md`` is generated from them by
:func:`markdown`, and ``diagnose serve`` renders them as HTML.
"""

from __future__ import annotations

import json
import re
import sys

from diagnoser.cli import UsageError
from diagnoser.outputs import docmd
from diagnoser.rules import REGISTRY, by_name
from diagnoser.rules.base import DOC_HEADINGS, Rule

_HEADING_RE = re.compile(r"^(" + "|".join(re.escape(h) for h in DOC_HEADINGS) + r"):?\s*$", re.M)
DOCS_NOTE = ("docs/sglang.md is in the project's repository; `diagnose serve` also serves it at /docs/sglang "
             "and this rule at /rules/{name}.")


def preamble(rule: type[Rule]) -> str:
    """The doc before its first section heading (the one-line summary, and any paragraph after it)."""
    doc = rule.doc()
    m = _HEADING_RE.search(doc)
    return (doc[:m.start()] if m else doc).strip()


def explain_text(rule: type[Rule], width: int | None = None) -> str:
    """One rule's doc as terminal text: sections under their headings, links as ``text (target)``."""
    w = width or docmd.terminal_width()
    out = [f"{rule.code} {rule.name} ({rule.severity.label})", "", docmd.to_text(preamble(rule), w)]
    for head, body in rule.doc_sections().items():
        if head:
            out += ["", f"{head}:", docmd.to_text(body, w, indent="    ")]
    if rule.defaults:
        out += ["", "Thresholds (override with --set NAME.KEY=VALUE or [rules.NAME] in --config):"]
        from diagnoser.outputs.term import Term

        t = Term(width=w)
        for k, v in rule.defaults.items():
            out.extend(t.wrap(rule.threshold_help.get(k, ""), "      ", f"  {rule.name}.{k} = {v}   "))
    out += ["", docmd.to_text(DOCS_NOTE.format(name=rule.name), w)]
    return "\n".join(out) + "\n"


def main(cmd: str, argv: list[str]) -> int:
    as_json = "--format" in argv and "json" in argv
    argv = [a for a in argv if a not in ("--format", "json", "text")]
    if cmd == "rules":
        if as_json:
            rows = [{"name": r.name, "code": r.code, "severity": r.severity.label, "summary": docmd.inline_text(r.summary_line()),
                     "thresholds": r.defaults} for r in REGISTRY]
            print(json.dumps(rows, indent=2))
            return 0
        width = max(len(r.name) for r in REGISTRY)
        from diagnoser.outputs.term import term_for

        term = term_for(sys.stdout, "never")
        for r in REGISTRY:
            head = f"{r.code}  {r.name.ljust(width)}  {r.severity.label:<8}  "
            print("\n".join(term.wrap(docmd.inline_text(r.summary_line()), " " * len(head), head)))
        return 0
    if not argv:
        raise UsageError("explain needs a rule name, e.g. 'diagnose explain kv_saturation'; 'diagnose rules' lists them")
    rule = by_name(argv[0])
    if rule is None:
        raise UsageError(f"no rule named {argv[0]!r}; 'diagnose rules' lists them")
    if as_json:
        # "doc" and "sections" are the Markdown source (docmd's subset); "text" is what explain prints
        print(json.dumps({"name": rule.name, "code": rule.code, "severity": rule.severity.label, "doc": rule.doc(),
                          "doc_format": "markdown", "sections": rule.doc_sections(), "text": explain_text(rule, 100),
                          "thresholds": rule.defaults, "threshold_help": rule.threshold_help}, indent=2))
        return 0
    sys.stdout.write(explain_text(rule))
    return 0


def rules_md_link(target: str) -> str | None:
    """docs/rules.md sits beside docs/sglang.md: ``docs/x.md#y`` → ``x.md#y``; other repo paths get ``../``."""
    if target.startswith("docs/"):
        return target.removeprefix("docs/")
    if target.startswith(("http://", "https://", "#")):
        return None
    return "../" + target


def markdown() -> str:
    """The rule catalogue as Markdown (docs/rules.md is generated from this; a test keeps it current)."""
    out = ["# Rule catalogue", "", "Generated from the rules' own docs (`diagnoser/rules/`); regenerate with",
           "`python -c 'from diagnoser.cli.rules_cmd import markdown; print(markdown(), end=\"\")' > docs/rules.md`.",
           "How diagnoser reads SGLang, which the references below link to, is in [sglang.md](sglang.md).", "",
           "| code | rule | severity | what it detects |", "|---|---|---|---|"]
    for r in REGISTRY:
        out.append(f"| {r.code} | [`{r.name}`](#{r.name}) | {r.severity.label} | {r.summary_line()} |")
    for r in REGISTRY:
        out += ["", f"## {r.name}", "", f"`{r.code}`, default severity {r.severity.label}.", "",
                docmd.rewrite_links(preamble(r), rules_md_link)]
        for head, body in r.doc_sections().items():
            if head:
                out += ["", f"### {head}", "", docmd.rewrite_links(body, rules_md_link)]
        if r.defaults:
            out += ["", "### Thresholds", "", "| threshold | default | meaning |", "|---|---|---|"]
            out += [f"| `{r.name}.{k}` | {v} | {r.threshold_help.get(k, '')} |" for k, v in r.defaults.items()]
    return "\n".join(out) + "\n"
