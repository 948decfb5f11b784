"""``diagnose catalogue …``: SGLang's catalogue (docs/catalogue.md).

* ``diagnose catalogue coverage [--format json|markdown] [--unknown] [--release V]``: per release, how many
  of SGLang's log templates the reader recognises, ignores on purpose (catalogue/ignore.toml) or does
  not know; ``--unknown`` lists the unknown ones (file:line); exits 1 when any is unknown. ``--shapes``
  instead reads every recognised template's instances under every prefix shape (prefixshapes.py) through
  the line parser and both bulk paths, and prints per shape how many read as under SGLang's own prefix
  (``--unknown`` lists the misses); exits 1 when any is missed.
* ``diagnose catalogue flags [--release V] [NAME]``: the ServerArgs fields of a release, their CLI
  spelling and default.
"""

from __future__ import annotations

import json
import sys

from diagnoser.cli import UsageError

USAGE = "usage: diagnose catalogue coverage [--format text|json|markdown] [--unknown] [--release V] [--shapes] | diagnose catalogue flags [--release V] [NAME]"


def _opt(argv: list[str], name: str) -> str | None:
    if name in argv:
        i = argv.index(name)
        if i + 1 >= len(argv):
            raise UsageError(f"{name} needs a value; {USAGE}")
        value = argv[i + 1]
        del argv[i:i + 2]
        return value
    return None


def _release(text: str | None) -> list[str] | None:
    if text is None:
        return None
    from diagnoser.engines.sglang import catalogue

    rels = [r for r in catalogue.releases() if r == text or r.startswith(text + ".post")]
    if not rels:
        raise UsageError(f"SGLang {text!r} is not in the catalogue ({catalogue.releases()[0]} … {catalogue.releases()[-1]})")
    return rels


def main(cmd: str, argv: list[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] not in ("coverage", "flags"):
        raise UsageError(USAGE)
    what = argv.pop(0)
    fmt = _opt(argv, "--format") or "text"
    if fmt not in ("text", "json", "markdown"):
        raise UsageError(f"--format is text, json or markdown, not {fmt!r}")
    rels = _release(_opt(argv, "--release"))
    if what == "flags":
        return _flags(argv, rels, fmt)
    from diagnoser.cli import sglang_coverage as coverage

    show_unknown = "--unknown" in argv
    shapes = "--shapes" in argv
    argv = [a for a in argv if a not in ("--unknown", "--shapes")]
    if argv:
        raise UsageError(f"unexpected argument {argv[0][:40]!r}; {USAGE}")
    if shapes:
        return _shapes(fmt, show_unknown)
    rows = coverage.per_release()
    if rels:
        rows = [r for r in rows if r["release"] in rels]
    unknown = coverage.unknown()
    if fmt == "json":
        print(json.dumps({"releases": rows, "unknown": [{"id": v.template.id, "file": v.template.file, "level": v.template.level,
                                                         "template": v.template.first_line} for v in unknown]}, indent=1))
    else:
        print(coverage.table(rows, markdown=fmt == "markdown"))
        total = {k: sum(r[k] for r in rows) for k in ("recognised", "ignored", "unknown")}
        print(f"\n{len(rows)} release(s); template-releases: {total['recognised']:,} recognised, {total['ignored']:,} ignored "
              f"({len(coverage.ignore_groups())} reviewed groups), {total['unknown']:,} unknown")
        if show_unknown:
            for v in unknown:
                print(f"  {v.template.id} {v.template.level:<7} {v.template.file}: {v.template.first_line[:120]}")
    return 1 if any(r["unknown"] for r in rows) else 0


def _shapes(fmt: str, show_missed: bool) -> int:
    from diagnoser.cli import sglang_coverage as coverage
    from diagnoser.outputs.termsafe import term_safe

    rows, misses = coverage.shape_check()
    if fmt == "json":
        print(json.dumps({"shapes": rows, "missed": [{"id": m.template.id, "file": m.template.file, "shape": m.shape, "path": m.path,
                                                      "line": m.line, "expected": repr(m.expected), "got": repr(m.got)} for m in misses]},
                         indent=1))
    else:
        print(coverage.shape_table(rows, markdown=fmt == "markdown"))
        n = next(iter(rows.values()))["instances"] if rows else 0
        print(f"\n{n:,} instances of recognised templates (deduplicated across releases) x {len(rows)} shapes x "
              f"{len(coverage.PATHS)} reading paths; {len(misses):,} (instance, shape, path) read otherwise")
        if show_missed:
            for m in misses:
                print(f"  {m.template.id} {m.shape:<16} {m.path:<5} {term_safe(m.line[:110])}")
    return 1 if misses else 0


def _flags(argv: list[str], rels: list[str] | None, fmt: str) -> int:
    from diagnoser.engines.sglang import catalogue

    idx = catalogue.releases().index(rels[-1]) if rels else len(catalogue.releases()) - 1
    name = argv[0].lstrip("-").replace("-", "_") if argv else None
    rows = []
    for a in catalogue.server_args():
        if not catalogue.in_release(a, idx):
            continue
        flags = [c["flag"] for c in a["cli"]]
        if name and a["field"] != name and not any(f.lstrip("-").replace("-", "_") == name for f in flags):
            continue
        rows.append({"field": a["field"], "cli": flags, "deprecated": [c["flag"] for c in a["cli"] if c["deprecated"]],
                     "type": a["type"], "default": a["default"]})
    if fmt == "json":
        print(json.dumps({"release": catalogue.releases()[idx], "args": rows}, indent=1, default=str))
    else:
        for r in rows:
            dep = f"  (deprecated: {', '.join(r['deprecated'])})" if r["deprecated"] else ""
            print(f"{', '.join(r['cli']) or '(no flag)':<48} {str(r['field']):<40} default {r['default']!r}{dep}"[:200])
    if name and not rows:
        print(f"no flag {argv[0]!r} at SGLang {catalogue.releases()[idx]}", file=sys.stderr)
        return 1
    return 0
