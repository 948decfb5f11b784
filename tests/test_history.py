"""``diagnose --once --save`` and ``diagnose history``: saved verdicts, listed and shown again, bounded,
terminal-safe, and one sentence for a missing or broken file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.cli import history
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnoser", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_saved_run_is_listed_and_shown_as_it_was_reported(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    r = diagnose("--once", "--replay", str(EXAMPLE), "--format", "json", "--save", "--history-db", str(db))
    assert r.returncode == 1, r.stderr[-2000:]
    printed = json.loads(r.stdout)
    r2 = diagnose("--once", "--replay", str(EXAMPLE), "--save", "--history-db", str(db))
    assert r2.returncode == 1 and "saved as run 2" in r2.stderr, r2.stderr[-2000:]

    ls = diagnose("history", "--db", str(db), "list", "--format", "json")
    assert ls.returncode == 0, ls.stderr
    runs = json.loads(ls.stdout)["runs"]
    assert [x["id"] for x in runs] == [2, 1]  # newest first
    top = printed["top"]["kv-full-retract"]
    assert runs[1]["top_rule"] == top["rule"] and runs[1]["status"] == "problems" and runs[1]["engine"] == "sglang"
    assert runs[1]["first_fix"] == f"{top['suggestion']['flag']} {top['suggestion']['current']} → {top['suggestion']['proposed']}"

    text = diagnose("history", "--db", str(db), "list")
    assert text.returncode == 0 and "kv_saturation (warning)" in text.stdout and "--max-total-tokens" in text.stdout

    shown = diagnose("history", "--db", str(db), "show", "1", "--format", "json")
    assert shown.returncode == 0 and json.loads(shown.stdout) == printed
    shown_text = diagnose("history", "--db", str(db), "show", "1")
    assert shown_text.returncode == 0 and "status: PROBLEMS" in shown_text.stdout


def test_history_is_bounded_and_keeps_the_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "h.sqlite"
    monkeypatch.setattr(history, "KEEP", 5)
    doc = {"status": "ok", "engine": "vllm", "top": {}, "findings": []}
    ids = [history.save(dict(doc, n=i), db, now=1_700_000_000 + i) for i in range(12)]
    kept = history.rows(db, 100)
    assert [r["id"] for r in kept] == ids[-5:][::-1]
    monkeypatch.setattr(history, "MAX_DOC_BYTES", 100)
    big = history.save({"status": "problems", "top": {}, "findings": [], "pad": "x" * 500}, db)
    with pytest.raises(history.HistoryError, match="only its summary was kept"):
        history.load(db, big)


def test_server_strings_are_listed_terminal_safe(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    evil = "srv\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202e"
    history.save({"status": "problems", "engine": "sglang", "findings": [],
                  "top": {evil: {"rule": "kv_saturation", "severity": "warning", "suggestion": {"flag": "--x\x1b[31m", "current": 1, "proposed": 2}}}}, db)
    out = history.list_text(history.rows(db, 10))
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out and "kv_saturation" in out


def test_a_missing_or_broken_history_file_is_one_sentence(tmp_path: Path) -> None:
    missing = diagnose("history", "--db", str(tmp_path / "none.sqlite"), "list")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no history yet" in missing.stderr
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"\x00\xffnot a database" * 100)
    bad = diagnose("history", "--db", str(junk), "list")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.startswith("diagnose history: "), bad.stderr
    db = tmp_path / "h.sqlite"
    history.save({"status": "ok", "top": {}, "findings": []}, db)
    nope = diagnose("history", "--db", str(db), "show", "99")
    assert nope.returncode == 2 and "no saved run 99" in nope.stderr
