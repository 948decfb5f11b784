"""The fleet part of a report (``diagnose --prometheus``): the JSON ``fleet`` key and the text view.

JSON: the document keeps its usual shape (``config``/``signals`` have one entry per target, findings
carry their target) plus::

    "fleet": {"source": {prometheus, selector, range, queries, query_seconds, …},
              "summary": {targets, states, pool_tokens, used_tokens, token_usage, running_reqs,
                          queue_reqs, gen_throughput_tps, headroom_requests, models: {MODEL: {…}}},
              "targets": [{target, labels, model, version, spelling, state, running, queue,
                           token_usage, pool_tokens, headroom_requests, worst_severity, findings,
                           missing_signals}, …],          # worst first
              "missing": {TARGET: [SIGNAL…]}, "failed_queries": {SIGNAL: message}}

Text: the fleet summary first, then the worst targets (``WORST`` of them, every one with
``--verbose``) with their findings.
"""

from __future__ import annotations

from typing import Any

from diagnoser.fleet.capacity import loads, summarize
from diagnoser.model import Severity, owned

WORST = 10
SEV_RANK = {"critical": 3, "warning": 2, "info": 1}
STATE_RANK = {"saturated": 3, "serving": 2, "idle": 1, "no data": 0}


def fleet_section(collection: Any, report: Any, tables: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``fleet`` key (``tables``: the report's signal table of each timeline, when built already)."""
    tls = collection.timelines
    rows = loads(tls, tables)
    worst: dict[str, int] = {}
    count: dict[str, int] = {}
    for f in report.findings:
        worst[f.target] = max(worst.get(f.target, 0), int(f.severity))
        count[f.target] = count.get(f.target, 0) + 1
    by_target = {tl.target: tl for tl in tls}
    labels = {int(s): s.label for s in Severity}
    targets = []
    for r in rows:
        tl = by_target[r.target]
        meta = tl.meta
        d = r.to_dict()
        d["labels"] = owned(meta.get("labels", {}))
        d["version"] = tl.version
        d["spelling"] = owned(meta.get("spelling", []))
        sev = worst.get(r.target, 0)
        d["worst_severity"] = labels[sev] if sev else None
        d["findings"] = count.get(r.target, 0)
        d["missing_signals"] = owned(meta.get("missing_signals", []))
        targets.append(d)
    targets.sort(key=lambda d: (-SEV_RANK.get(d["worst_severity"] or "", 0), -STATE_RANK.get(d["state"], 0),
                                -(d["queue"] or 0), -(d["token_usage"] or 0), d["target"]))
    raw = dict(getattr(collection, "fleet", {}) or {})
    missing = raw.pop("missing", {})
    failed = raw.pop("failed_queries", {})
    spell: dict[str, int] = {}
    for d in targets:
        for s in d["spelling"]:
            spell[s] = spell.get(s, 0) + 1
    summary = summarize(rows)
    summary["spellings"] = spell
    # (the document owns all it holds: the report door passes on what it leaves unchanged as it is)
    return {"source": owned(raw), "summary": summary, "targets": targets, "missing": owned(missing), "failed_queries": owned(failed)}


def _n(v: Any, fmt: str = "{:,.0f}") -> str:
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def summary_lines(fleet: dict[str, Any]) -> list[str]:
    s = fleet["summary"]
    src = fleet.get("source", {})
    st = s["states"]
    out = ["Fleet summary"]
    rng = src.get("range", {})
    if src.get("prometheus"):
        out.append(f"  via Prometheus {src['prometheus']}{' ' + src['selector'] if src.get('selector') else ''}: "
                   f"{src.get('queries', 0)} queries in {src.get('collect_seconds', 0):.1f} s, step {_n(rng.get('step_s'), '{:g}')} s")
    out.append(f"  {s['targets']} targets: {st['saturated']} saturated · {st['serving']} serving · {st['idle']} idle"
               + (f" · {st['no data']} without data" if st["no data"] else ""))
    out.append(f"  KV pool {_n(s['pool_tokens'])} tokens, {_n(s['token_usage'], '{:.0%}')} used · running {_n(s['running_reqs'])}"
               f" · queued {_n(s['queue_reqs'])} · gen {_n(s['gen_throughput_tps'])} tok/s")
    if s["headroom_requests"] is not None:
        out.append(f"  headroom ≈ {_n(s['headroom_requests'])} more requests (KV estimate over {s['headroom_known_targets']} "
                   f"of {s['targets']} targets)")
    else:
        out.append("  headroom unknown: needs pool size, token usage and running requests")
    models = s.get("models", {})
    if len(models) > 1:
        for m, b in list(models.items())[:WORST]:
            out.append(f"  · {m}: {b['targets']} targets, {b['states']['saturated']} saturated, queued {_n(b['queue_reqs'])}, "
                       f"KV {_n(b['token_usage'], '{:.0%}')}, headroom {_n(b['headroom_requests'])}"[:100])
    if len(s.get("spellings", {})) > 1:
        out.append("  names stored as " + ", ".join(f"{k}* on {v} targets" for k, v in sorted(s["spellings"].items())))
    if fleet.get("failed_queries"):
        out.append("  missing for every target: " + ", ".join(sorted(fleet["failed_queries"])))
    if fleet.get("missing"):
        out.append(f"  {len(fleet['missing'])} target(s) miss some signals (see inputs below / JSON fleet.missing)")
    return out


def worst_table(fleet: dict[str, Any], limit: int | None) -> list[str]:
    rows = fleet["targets"][:limit] if limit else fleet["targets"]
    if not rows:
        return []
    head = f"Worst targets ({len(rows)} of {len(fleet['targets'])})"
    w = max(12, min(34, max(len(r["target"]) for r in rows)))
    out = [head, f"  {'target':<{w}} {'state':<9} {'run':>6} {'queue':>6} {'KV':>5} {'headroom':>8}  findings"]
    for r in rows:
        sev = r["worst_severity"] or "-"
        out.append(f"  {r['target'][:w]:<{w}} {r['state']:<9} {_n(r['running'], '{:.1f}'):>6} {_n(r['queue'], '{:.1f}'):>6} "
                   f"{_n(r['token_usage'], '{:.2f}'):>5} {_n(r['headroom_requests']):>8}  {r['findings']} ({sev})")
    return out


def render_fleet(doc: dict[str, Any], verbose: bool = False, term: Any = None) -> str:
    """Fleet summary first, then the worst targets and their findings (text.render for those)."""
    from diagnoser.outputs.text import render

    fleet = doc["fleet"]
    limit = None if verbose else WORST
    keep = {r["target"] for r in (fleet["targets"][:limit] if limit else fleet["targets"])}
    findings = [f for f in doc["findings"] if f["target"] in keep or f["target"].startswith("fleet/")]
    hidden = len(doc["findings"]) - len(findings)
    sub = {k: v for k, v in doc.items() if k != "fleet"}
    order = [r["target"] for r in fleet["targets"] if r["target"] in keep]
    sub["signals"] = {t: doc["signals"].get(t, {}) for t in order}
    sub["config"] = {t: doc["config"].get(t, {}) for t in order}
    sub["findings"] = sorted(findings, key=lambda f: (not f["target"].startswith("fleet/"), -SEV_RANK.get(f["severity"], 0)))
    text = render(sub, verbose=verbose, term=term)
    if not fleet["targets"]:
        return text
    head, _sep, rest = text.partition("\n\n")
    block = summary_lines(fleet) + [""] + worst_table(fleet, limit)
    if hidden:
        block.append(f"  {hidden} more finding(s) on other targets: --verbose or --format json shows them")
    return head + "\n\n" + "\n".join(block) + "\n\n" + rest
