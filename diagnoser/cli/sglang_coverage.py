"""Coverage of SGLang's log templates by diagnoser's reader, per release (``diagnose catalogue coverage``).

For every template of the catalogue an instance is generated (a value of each placeholder's type) and fed,
behind SGLang's own prefix, to the reader's public single-line entry point
(:meth:`diagnoser.engines.sglang.logs.SGLangLogParser.feed`). A template is

* **recognised** when the reader reads its instance;
* **ignored** when it stands in a reviewed group of ``catalogue/ignore.toml`` (each group gives its
  reason: debug-level lines, one request's errors, configuration validation …), or when it is
  *opaque*: the message is a variable with no literal text of its own (``logger.error(e)``);
* **unknown** otherwise: a state line the reader should read and does not.

The counts are per release: a template counts at every release where it exists.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from diagnoser.engines.sglang import catalogue, templates
from diagnoser.model import LogEvent

PREFIX = "[2026-01-01 00:00:00 TP0] "


@dataclass(frozen=True, slots=True)
class IgnoreGroup:
    name: str
    reason: str
    pattern: re.Pattern[str] | None
    level: frozenset[str]
    file: re.Pattern[str] | None

    def covers(self, t: templates.Template) -> bool:
        if self.level and t.level not in self.level:
            return False
        if self.file is not None and not self.file.search(t.file):
            return False
        return self.pattern is None or self.pattern.search(t.first_line) is not None


@cache
def ignore_groups() -> tuple[IgnoreGroup, ...]:
    raw = tomllib.loads((catalogue.HERE / "ignore.toml").read_text())
    out = []
    for g in raw.get("group", []):
        if not g.get("reason"):
            raise ValueError(f"ignore group {g.get('name')!r} has no reason")
        out.append(IgnoreGroup(g["name"], g["reason"], re.compile(g["pattern"]) if g.get("pattern") else None,
                               frozenset(g.get("level", [])), re.compile(g["file"]) if g.get("file") else None))
    return tuple(out)


class _Sink:
    """Records what the reader wrote for one line."""

    def __init__(self) -> None:
        self.signals: list[str] = []
        self.events: list[str] = []
        self.config: dict[str, Any] = {}

    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        self.signals.append(signal)

    def add_event(self, event: LogEvent) -> None:
        self.events.append(event.kind)

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        self.config[name] = value


def read_one(line: str) -> tuple[bool, _Sink]:
    """Feed one line to a fresh reader; (recognised, what it wrote)."""
    from diagnoser.engines.sglang.logs import SGLangLogParser

    sink = _Sink()
    p = SGLangLogParser(sink, "coverage")
    ok = p.feed(line, 1)
    p.finish()
    return ok, sink


@dataclass(frozen=True, slots=True)
class Verdict:
    template: templates.Template
    status: str  # recognised | ignored | unknown
    why: str  # the ignore group, "opaque", or what the reader wrote


def classify(c: templates.Compiled) -> Verdict:
    t = c.template
    body = templates.instance(c)
    for fill in templates.FILLS if body is not None else ():
        ok, sink = read_one(PREFIX + (templates.instance(c, fill=fill) or ""))
        if ok:
            wrote = sorted(set(sink.signals)) + sorted(set(sink.events)) + sorted(sink.config)
            return Verdict(t, "recognised", ", ".join(wrote[:6]) or "counted")
    for g in ignore_groups():
        if g.covers(t):
            return Verdict(t, "ignored", g.name)
    if body is None:
        return Verdict(t, "ignored", "opaque")
    return Verdict(t, "unknown", "")


@cache
def verdicts() -> tuple[Verdict, ...]:
    return tuple(classify(c) for c in templates.compiled())


def per_release() -> list[dict[str, Any]]:
    """One row per release: recognised / ignored / unknown templates present at it."""
    rels = catalogue.releases()
    counts = [Counter() for _ in rels]
    for v in verdicts():
        for a, b in v.template.releases:
            for i in range(a, b + 1):
                counts[i][v.status] += 1
    return [{"release": r, "recognised": c["recognised"], "ignored": c["ignored"], "unknown": c["unknown"],
             "total": sum(c.values())} for r, c in zip(rels, counts, strict=True)]


def unknown() -> list[Verdict]:
    return [v for v in verdicts() if v.status == "unknown"]


def table(rows: list[dict[str, Any]] | None = None, *, markdown: bool = False) -> str:
    rows = rows if rows is not None else per_release()
    head = ("release", "templates", "recognised", "ignored", "unknown")
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in rows:
            lines.append(f"| {r['release']} | {r['total']} | {r['recognised']} | {r['ignored']} | {r['unknown']} |")
    else:
        lines.append(f"{'release':<14} {'templates':>9} {'recognised':>10} {'ignored':>8} {'unknown':>8}")
        for r in rows:
            lines.append(f"{r['release']:<14} {r['total']:>9} {r['recognised']:>10} {r['ignored']:>8} {r['unknown']:>8}")
    return "\n".join(lines)


# -- the same templates under every prefix shape ---------------------------------------------------------
PATHS = ("line", "scan", "regex")  # the line parser, the bulk reader with the C scanner, and without it


def _reading(tl: Any, ok: bool) -> tuple[Any, ...]:
    """What a reader made of one line, without its time or rank: recognised, event kinds, signals with their
    values, config facts."""
    sig = sorted((name, tuple(round(float(v), 9) for v in s.values)) for (name, _rank), s in tl.series.items())
    return (ok, tuple(sorted(e.kind for e in tl.events)), tuple(sig),
            tuple(sorted((k, repr(v)) for k, v in tl.config.items() if not k.startswith("version"))))


def read_through(data: bytes, how: str) -> tuple[Any, ...]:
    """Read ``data`` (one or more lines) through one reading path of :data:`PATHS` with a fresh reader."""
    import io
    import os

    import diagnoser.engines.sglang.logfast as lf
    from diagnoser.engines.sglang import ADAPTER
    from diagnoser.sources.logs import finish_report, open_log_reader
    from diagnoser.timeline import Timeline

    old, scan = os.environ.get("DIAGNOSER_NO_SCAN"), lf.SCAN
    if how != "line":
        os.environ["DIAGNOSER_NO_SCAN"] = "1" if how == "regex" else ""
        lf.SCAN = "unloaded"
    try:
        tl = Timeline(target="coverage")
        r = open_log_reader(ADAPTER, tl, "coverage.log", head=data[:4096])
        if how == "line":
            r.feed_lines(io.BytesIO(data))
        else:
            r.feed_stream(io.BytesIO(data), bulk_min=0, workers=0)
        finish_report(ADAPTER, r)
        return _reading(tl, r.report.lines_recognized > 0)
    finally:
        if how != "line":
            if old is None:
                os.environ.pop("DIAGNOSER_NO_SCAN", None)
            else:
                os.environ["DIAGNOSER_NO_SCAN"] = old
            lf.SCAN = scan


@dataclass(frozen=True, slots=True)
class ShapeMiss:
    template: templates.Template
    shape: str
    path: str
    line: str  # the instance under SGLang's own prefix
    expected: tuple[Any, ...]
    got: tuple[Any, ...]


def recognised_instances() -> list[tuple[templates.Template, str]]:
    """One line per recognised template and fill that the reader reads under SGLang's own prefix; a line
    two templates (or two releases' copies) print is checked once. The list fill (``templates.FILLS[-1]``:
    ``[1, 2, 4, 8]`` for an int, which is what ``bs={runner.capture_bs}`` prints) is used only for a
    template with a ``bs`` field or one no plain value makes readable: in another template it puts a
    list where SGLang prints a number (``[gpu_id=[1, 2, 4, 8]]``)."""
    out: list[tuple[templates.Template, str]] = []
    seen: set[str] = set()
    by_id = {v.template.id: v for v in verdicts()}
    for c in templates.compiled():
        if by_id[c.template.id].status != "recognised":
            continue
        found = False
        for fill in templates.FILLS:
            if found and fill is templates.FILLS[-1] and "bs" not in c.keys:
                break
            line = PREFIX + (templates.instance(c, fill=fill) or "")
            if not read_one(line)[0]:
                continue
            found = True
            if line in seen:
                continue
            seen.add(line)
            out.append((c.template, line))
    return out


def shape_check(shapes: tuple[str, ...] | None = None, paths: tuple[str, ...] = PATHS) -> tuple[dict[str, dict[str, int]], list[ShapeMiss]]:
    """Every recognised instance under every prefix shape (prefixshapes.SHAPES) through every reading path,
    against what the line parser makes of it under SGLang's own prefix. Returns (per shape: instances,
    same, missed) and the misses (about 3 s for every shape and path on one CPU; computed once per
    process for the same shapes and paths)."""
    from diagnoser.engines.sglang import prefixshapes

    rows, misses = _shape_check(shapes or tuple(prefixshapes.SHAPES), paths)
    return {k: dict(v) for k, v in rows.items()}, list(misses)


@cache
def _shape_check(shapes: tuple[str, ...], paths: tuple[str, ...]) -> tuple[dict[str, dict[str, int]], tuple[ShapeMiss, ...]]:
    from diagnoser.engines.sglang import prefixshapes

    rows: dict[str, dict[str, int]] = {}
    misses: list[ShapeMiss] = []
    insts = recognised_instances()
    expected = [read_through(line.encode(), "line") for _, line in insts]
    for shape in shapes:
        row = rows.setdefault(shape, {"instances": len(insts), "same": 0, "missed": 0})
        for (t, line), want in zip(insts, expected, strict=True):
            data = prefixshapes.wrap(shape, line.encode())
            bad = [(how, got) for how in paths if (got := read_through(data, how)) != want]
            row["same" if not bad else "missed"] += 1
            misses.extend(ShapeMiss(t, shape, how, line, want, got) for how, got in bad)
    return rows, tuple(misses)


def shape_table(rows: dict[str, dict[str, int]], *, markdown: bool = False) -> str:
    if markdown:
        lines = ["| shape | instances | read the same | missed |", "|---|---|---|---|"]
        lines += [f"| `{s}` | {r['instances']} | {r['same']} | {r['missed']} |" for s, r in rows.items()]
    else:
        lines = [f"{'shape':<18} {'instances':>9} {'same':>6} {'missed':>7}"]
        lines += [f"{s:<18} {r['instances']:>9} {r['same']:>6} {r['missed']:>7}" for s, r in rows.items()]
    return "\n".join(lines)
