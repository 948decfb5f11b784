"""The golden case corpus: every folder under tests/data/cases/ (real public cases, verbatim) and
tests/cases/ (runs of the real CPU engine, and a few written cases) runs through the real CLI.

Each folder holds ``server.log``, ``metrics.txt`` (one saved exposition, read with ``--metrics-file``) and/or
``metrics/*_<epoch>.prom`` (read with ``--replay``),
``source.md``, ``expected.json`` and optionally ``args.json`` (extra CLI arguments; ``{case}`` is the folder,
``{data}`` is tests/data). The runner calls ``diagnoser.cli.main([... "--once", "--format", "json"])`` in
process and asserts:

* every expected finding label is reported (``"healthy"``: nothing at warning or above; ``"a|b"``
  accepts either; ``"other:NAME"`` is the rule NAME, or the rule ``OTHER_LABELS`` maps it to; a (case,
  label) listed in ``NOT_IN_THE_LINES`` cannot be shown by the case's lines: not asserted, and an error
  once it is found);
* every expected suggested flag appears in some suggestion;
* ``not_findings`` are absent and nothing exceeds ``max_severity`` when given;
* evidence that cites ``server.log:N`` points at a real, non-empty line of that log.

A last test checks the catalogue's coverage: each target rule fires on some case and stays silent on
another.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.model import Severity
from diagnoser.rules import REGISTRY
from tests.conftest import DATA

CASES = Path(__file__).parent / "cases"
REAL_CASES = DATA / "cases"
CASE_DIRS = sorted((p for d in (REAL_CASES, CASES) for p in d.iterdir() if (p / "expected.json").is_file()),
                   key=lambda p: p.name)
REAL = sorted(p.name for p in REAL_CASES.iterdir() if p.is_dir())
_RESULTS: dict[str, dict[str, Any]] = {}
_LINE = re.compile(r"(server\.log):(\d+)\b")


def case_argv(case: Path) -> list[str]:
    extra: list[str] = []
    if (case / "args.json").is_file():
        raw = json.loads((case / "args.json").read_text())
        extra = [a.replace("{case}", str(case)).replace("{data}", str(DATA)) for a in raw]
    argv = ["--once", "--format", "json"]
    if "--replay" not in extra and "--url" not in extra:
        if (case / "metrics").is_dir():
            argv += ["--replay", str(case)]
        else:
            if (case / "metrics.txt").is_file():  # one saved /metrics dump, as a user passes it
                argv += ["--metrics-file", str(case / "metrics.txt")]
            if (case / "server.log").is_file():
                argv += ["--log", str(case / "server.log")]
    return argv + extra


# ``other:NAME`` labels name a diagnosis in the case's own words. The catalogue rule that makes that
# diagnosis satisfies it: a rule named NAME, or the rule listed here (with why it is the same diagnosis).
OTHER_LABELS: dict[str, str] = {
    "request_exceeds_kv_pool": "kv_pool_too_small",  # a request longer than the pool: the pool is too small for it
}
# (case, label) pairs the case's own lines cannot show (the thread found it later, off the log): not
# asserted, each with its reason; a listed label that is found after all fails the test (drop it here)
NOT_IN_THE_LINES: dict[tuple[str, str], str] = {
    ("126-sglang-9266-pd-bootstrap-failures-high-concurrency", "other:engine_leak"):
        "the decode side's request-slot leak was found later in the thread; the posted prefill lines show only its symptom "
        "(bootstrap timeouts and aborts), which pd_transfer names with a leak among the candidate causes; no leak-check line is posted",
}


def label_rules(label: str) -> set[str]:
    """The rule names that satisfy a label (``a|b`` accepts either; ``other:NAME`` through OTHER_LABELS)."""
    out: set[str] = set()
    for part in label.split("|"):
        if part.startswith("other:"):
            name = part[len("other:"):]
            out.add(OTHER_LABELS.get(name, name))
        else:
            out.add(part)
    return out


def run_case(case: Path) -> dict[str, Any]:
    if case.name not in _RESULTS:
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = cli_main(case_argv(case))
        doc = json.loads(buf.getvalue())
        doc["_rc"] = rc
        _RESULTS[case.name] = doc
    return _RESULTS[case.name]


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case(case: Path) -> None:
    expected = json.loads((case / "expected.json").read_text())
    doc = run_case(case)
    assert not doc["errors"] or all(e.get("source") == "input" for e in doc["errors"]), doc["errors"]
    found = {f["rule"] for f in doc["findings"]}
    loud = [f for f in doc["findings"] if Severity.parse(f["severity"]) >= Severity.WARNING]
    summary = [(f["rule"], f["severity"], f["summary"][:120]) for f in doc["findings"]]
    labels = expected["findings"]
    if "healthy" in labels:  # nothing at warning or above; other labels (info findings) must still be there
        assert not loud, f"healthy case reported {[(f['rule'], f['severity']) for f in loud]}"
    wanted = [(lab, label_rules(lab)) for lab in labels if lab != "healthy"]
    missing = [lab for lab, rules in wanted if not rules & found and (case.name, lab) not in NOT_IN_THE_LINES]
    assert not missing, f"missing {missing}; got {summary}"
    stale = [lab for lab, rules in wanted if rules & found and (case.name, lab) in NOT_IN_THE_LINES]
    assert not stale, f"{stale} is listed as not in the lines but was found: drop it from NOT_IN_THE_LINES"
    flags = {s["flag"] for f in doc["findings"] for s in f["suggestions"]}
    missing_flags = [fl for fl in expected.get("suggested_flags", []) if not set(fl.split("|")) & flags]
    assert not missing_flags, f"missing suggested flags {missing_flags}; got {sorted(flags)}"
    unwanted = [r for r in expected.get("not_findings", []) if r in found]
    assert not unwanted, f"should stay silent: {unwanted}; got {summary}"
    if "max_severity" in expected:
        cap = Severity.parse(expected["max_severity"])
        over = [(f["rule"], f["severity"]) for f in doc["findings"] if Severity.parse(f["severity"]) > cap]
        assert not over, f"above {expected['max_severity']}: {over}"
    # every finding is well formed
    for f in doc["findings"]:
        assert f["summary"] and f["confidence"] in ("low", "medium", "high") and f["docs"].startswith("diagnose explain ")
        for s in f["suggestions"]:
            assert s["flag"].startswith("--") and s["proposed"] is not None and s["why"]
            assert s["flag"] != "--cpu-offload-gb"
            assert s["current"] is None or str(s["current"]).lower() != str(s["proposed"]).lower()
    _check_line_refs(case, doc)


def _log_lines(case: Path, doc: dict[str, Any]) -> list[str] | None:
    logs = [i["source"] for i in doc["inputs"] if i["kind"] == "log"]
    if not logs:
        return None
    return Path(logs[0]).read_bytes().decode(errors="replace").split("\n")  # numbered by newline, like grep -n


def _check_line_refs(case: Path, doc: dict[str, Any]) -> None:
    lines = _log_lines(case, doc)
    if lines is None:
        return
    for f in doc["findings"]:
        for e in f["evidence"]:
            for m in _LINE.finditer(str(e["source"])):
                n = int(m.group(2))
                assert 1 <= n <= len(lines), f"{f['rule']}: {e['source']} is past the end ({len(lines)} lines)"
                assert lines[n - 1].strip(), f"{f['rule']}: {e['source']} is an empty line"


def test_other_labels_are_rules_or_explained() -> None:
    """Every ``other:`` label of a real case maps to a rule of the catalogue (the rule may still stay silent
    where the case's lines cannot show it: NOT_IN_THE_LINES, with the reason)."""
    names = {r.name for r in REGISTRY}
    for case in CASE_DIRS:
        for lab in json.loads((case / "expected.json").read_text())["findings"]:
            for part in lab.split("|"):
                if part.startswith("other:"):
                    name = part[len("other:"):]
                    assert OTHER_LABELS.get(name, name) in names, f"{case.name}: {part} matches no rule"
    assert all(v in names for v in OTHER_LABELS.values())
    cases = {c.name for c in CASE_DIRS}
    assert all(c in cases for c, _ in NOT_IN_THE_LINES)


@pytest.mark.parametrize("name", REAL)
def test_every_real_case_names_its_source(name: str) -> None:
    """A real case is kept as posted: its input, the expected labels and a source note with the thread URL."""
    case = REAL_CASES / name
    assert (case / "server.log").is_file() or (case / "metrics.txt").is_file(), f"{name} has no input"
    assert (case / "expected.json").is_file(), f"{name} has no expected.json"
    src = (case / "source.md").read_text()
    assert re.search(r"https?://|(issue|PR|pull) #\d+", src), f"{name}/source.md must name the public thread it came from"


@pytest.mark.parametrize("name", [n for n in REAL if (REAL_CASES / n / "server.log").is_file()])
def test_real_case_text_report_cites_log_lines(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnose --once --log` on each real case with a log prints evidence pointing at real line numbers."""
    log = REAL_CASES / name / "server.log"
    lines = log.read_bytes().decode(errors="replace").split("\n")  # numbered by newline, like grep -n
    rc = cli_main(["--once", "--log", str(log), "--verbose"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    refs = [int(n) for n in re.findall(r"server\.log:(\d+)", out)]
    if "Findings (" not in out:  # a healthy case with nothing to report has nothing to cite
        assert "No problem found" in out
        return
    assert refs, f"no evidence line reference in:\n{out}"
    assert all(1 <= n <= len(lines) and lines[n - 1].strip() for n in refs)


def test_each_rule_fires_somewhere_and_stays_silent_elsewhere() -> None:
    fired: dict[str, set[str]] = {}
    for case in CASE_DIRS:
        try:
            doc = run_case(case)
        except pytest.skip.Exception:
            continue
        for f in doc["findings"]:
            fired.setdefault(f["rule"], set()).add(case.name)
    names = [c.name for c in CASE_DIRS]
    for rule in REGISTRY:
        if rule.scope != "target":
            continue
        cases = fired.get(rule.name, set())
        assert cases, f"{rule.name} fires on no case"
        assert len(cases) < len(names), f"{rule.name} fires on every case"
