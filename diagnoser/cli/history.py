"""``diagnose history``: the verdicts of earlier ``diagnose --once --save`` runs, kept in a local SQLite file.

``--once --save`` appends the run's report (the same redacted JSON document ``--format json`` prints) to
the history file; ``diagnose history list`` shows one line per saved run (when, targets, engine, status,
top cause, first fix), ``diagnose history show ID`` prints a saved report again as text, JSON or
Markdown, and ``diagnose history clear`` empties the file. ``diagnose compare`` judges two recordings;
this is the lighter record of what each run concluded.

The file is ``--db PATH``, else ``$DIAGNOSER_HISTORY``, else ``$XDG_STATE_HOME/diagnoser/history.sqlite``
(``~/.local/state/diagnoser/history.sqlite``). It is bounded: the newest :data:`KEEP` runs are kept, and a
report larger than :data:`MAX_DOC_BYTES` is kept as its summary line only. Saved reports are redacted
like every output (no secret from server args, URLs or logs), and every saved string is printed through
the terminal-safe path, since a report holds server-provided strings.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

KEEP = 1000  # saved runs kept; older ones are dropped on save
MAX_DOC_BYTES = 4 << 20  # a saved report's JSON; above it only the summary line is kept

SCHEMA = """CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    status TEXT NOT NULL,
    engine TEXT NOT NULL,
    targets TEXT NOT NULL,
    top_rule TEXT NOT NULL,
    top_severity TEXT NOT NULL,
    first_fix TEXT NOT NULL,
    doc TEXT
)"""


class HistoryError(Exception):
    """The history file cannot be used: one sentence for the user."""


def default_path() -> Path:
    env = os.environ.get("DIAGNOSER_HISTORY")
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "diagnoser" / "history.sqlite"


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    if not create and not path.exists():
        raise HistoryError(f"no history yet at {path}: save a run with 'diagnose --once --save …'")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(path), timeout=5.0)
        con.execute(SCHEMA)
        return con
    except (OSError, sqlite3.Error) as e:
        raise HistoryError(f"cannot use the history file {path}: {e}") from None


def summary(doc: dict[str, Any]) -> dict[str, str]:
    """The one-line summary of a report: its targets, engine, status, top cause and first fix."""
    top = doc.get("top") if isinstance(doc.get("top"), dict) else {}
    targets = sorted(str(t) for t in top) or sorted({str(f.get("target", "")) for f in doc.get("findings", []) if isinstance(f, dict)} - {""})
    sev_rank = {"critical": 3, "warning": 2, "info": 1}
    best: dict[str, Any] = {}
    for t in top.values() if isinstance(top, dict) else ():
        if isinstance(t, dict) and sev_rank.get(str(t.get("severity")), 0) > sev_rank.get(str(best.get("severity")), 0):
            best = t
    fix = ""
    s = best.get("suggestion") if isinstance(best.get("suggestion"), dict) else None
    if s:
        fix = f"{s.get('flag', '')} {s.get('current', '?')} → {s.get('proposed', '?')}".strip()
    return {"status": str(doc.get("status", "")), "engine": str(doc.get("engine") or ""), "targets": ", ".join(targets),
            "top_rule": str(best.get("rule", "")), "top_severity": str(best.get("severity", "")), "first_fix": fix}


def save(doc: dict[str, Any], path: Path | None = None, now: float | None = None) -> int:
    """Append one report; keep the newest :data:`KEEP`. Returns the run's id."""
    from diagnoser.jsonout import dumps

    path = path or default_path()
    con = _connect(path, create=True)
    try:
        text = dumps(doc)
        sm = summary(doc)
        with con:
            cur = con.execute(
                "INSERT INTO runs (ts, status, engine, targets, top_rule, top_severity, first_fix, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (time.time() if now is None else now, sm["status"], sm["engine"], sm["targets"], sm["top_rule"], sm["top_severity"],
                 sm["first_fix"], text if len(text.encode("utf-8", "replace")) <= MAX_DOC_BYTES else None))
            con.execute("DELETE FROM runs WHERE id <= (SELECT MAX(id) FROM runs) - ?", (KEEP,))
        return int(cur.lastrowid or 0)
    except sqlite3.Error as e:
        raise HistoryError(f"cannot save to the history file {path}: {e}") from None
    finally:
        con.close()


def rows(path: Path, limit: int) -> list[dict[str, Any]]:
    con = _connect(path, create=False)
    try:
        cur = con.execute("SELECT id, ts, status, engine, targets, top_rule, top_severity, first_fix FROM runs ORDER BY id DESC LIMIT ?",
                          (max(1, limit),))
        names = [c[0] for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    except sqlite3.Error as e:
        raise HistoryError(f"cannot read the history file {path}: {e}") from None
    finally:
        con.close()


def load(path: Path, run_id: int) -> dict[str, Any]:
    con = _connect(path, create=False)
    try:
        r = con.execute("SELECT doc, status, targets, top_rule, first_fix FROM runs WHERE id = ?", (run_id,)).fetchone()
    except sqlite3.Error as e:
        raise HistoryError(f"cannot read the history file {path}: {e}") from None
    finally:
        con.close()
    if r is None:
        raise HistoryError(f"no saved run {run_id} in {path}: 'diagnose history list' shows the ids")
    if r[0] is None:
        raise HistoryError(f"run {run_id} was larger than {MAX_DOC_BYTES >> 20} MiB, so only its summary was kept: "
                           f"{r[1]}, {r[2]}, {r[3] or 'no finding'} {r[4]}".rstrip())
    try:
        doc = json.loads(r[0])
    except ValueError:
        raise HistoryError(f"saved run {run_id} in {path} is not readable JSON") from None
    if not isinstance(doc, dict):
        raise HistoryError(f"saved run {run_id} in {path} is not a report")
    return doc


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def list_text(items: list[dict[str, Any]]) -> str:
    from diagnoser.outputs.termsafe import term_safe

    if not items:
        return "No saved runs.\n"
    lines = [f"{'id':>5}  {'when':19}  {'status':8}  {'engine':6}  {'top cause':28}  first fix  (targets)"]
    for it in items:
        cause = f"{it['top_rule']} ({it['top_severity']})" if it["top_rule"] else "-"
        lines.append(term_safe(f"{it['id']:>5}  {_when(it['ts'])}  {it['status']:8}  {it['engine'] or 'sglang':6}  {cause:28}  "
                               f"{it['first_fix'] or '-'}  ({it['targets'] or '-'})"))
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diagnose history", description="verdicts of earlier 'diagnose --once --save' runs")
    p.add_argument("--db", default=None, help="the history file (default $DIAGNOSER_HISTORY, else $XDG_STATE_HOME/diagnoser/history.sqlite)")
    sub = p.add_subparsers(dest="action")
    ls = sub.add_parser("list", help="one line per saved run, newest first")
    ls.add_argument("--limit", type=int, default=20, help="runs to show (default 20)")
    ls.add_argument("--format", choices=("text", "json"), default="text")
    sh = sub.add_parser("show", help="print a saved run's report again")
    sh.add_argument("id", type=int)
    sh.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    sh.add_argument("--verbose", "-v", action="store_true")
    sub.add_parser("clear", help="delete every saved run")
    return p


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    path = Path(args.db) if args.db else default_path()
    action = args.action or "list"
    try:
        if action == "list":
            items = rows(path, getattr(args, "limit", 20))
            if getattr(args, "format", "text") == "json":
                from diagnoser.jsonout import dumps

                sys.stdout.write(dumps({"history": str(path), "runs": items}, indent=2) + "\n")
            else:
                sys.stdout.write(list_text(items))
            return 0
        if action == "show":
            doc = load(path, args.id)
            if args.format == "json":
                from diagnoser.jsonout import dumps

                sys.stdout.write(dumps(doc, indent=2) + "\n")
            elif args.format == "markdown":
                from diagnoser.outputs.markdown import render_markdown

                sys.stdout.write(render_markdown(doc))
            else:
                from diagnoser.outputs.term import term_for
                from diagnoser.outputs.text import render

                try:
                    out = render(doc, verbose=args.verbose, term=term_for(sys.stdout, "auto"))
                except Exception as e:  # a report saved by another version may lack what this renderer wants
                    raise HistoryError(f"saved run {args.id} cannot be shown as text by this version ({type(e).__name__}); "
                                       "try --format json") from None
                sys.stdout.write(out)
            return 0
        con = _connect(path, create=False)
        try:
            with con:
                n = con.execute("DELETE FROM runs").rowcount
        finally:
            con.close()
        print(f"Deleted {n} saved run(s) from {path}.")
        return 0
    except HistoryError as e:
        from diagnoser.outputs.termsafe import term_safe

        print(term_safe(f"diagnose history: {e}"), file=sys.stderr)
        return 2
