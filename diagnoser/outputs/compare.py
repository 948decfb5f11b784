"""``diagnose compare BEFORE AFTER``: judge a change, like a canary analysis.

Both recordings (bundles or run directories) are diagnosed as ``diagnose --once --replay`` would; then:

* the flags that changed (server args, and the effective pool / slot cap / chunk sizes the engine printed);
* the headline numbers before and after: running (median while busy), queued (median), KV usage (mean),
  gen tok/s (mean while busy), TTFT p95 (over the window), retractions, with the relative change;
* which findings resolved, which stayed, which are new;
* for each suggestion made on BEFORE: whether AFTER applied it, and predicted vs realized for the numbers
  its projection gave (pool tokens, running requests, gen throughput), with whether the realized number
  moved the predicted way. The realized numbers are read the way the projection's were (the capacity
  model's mean running batch and throughput over the decode readings), so the two compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from diagnoser.evaluate import top_cause
from diagnoser.model import Severity
from diagnoser.timeline import Timeline
from diagnoser.timeline.derived import window_rate

# server args that differ between any two launches and say nothing about the change
IGNORED_ARGS = frozenset({"port", "host", "random_seed", "nccl_port", "dist_init_addr", "launch_command", "api_key", "admin_api_key",
                          "file_storage_path", "log_requests_level", "served_model_name", "model_path", "tokenizer_path",
                          "metrics_port", "grpc_port", "smg_http_sidecar_port",
                          # server info fields beside the args (the scheduler's values, not flags)
                          "max_total_num_tokens", "max_req_input_len", "version", "status", "startup_time",
                          "last_gen_throughput", "weight_version"})
EFFECTIVE = (("max_total_tokens", "pool tokens"), ("max_running_requests", "max running requests (effective)"),
             ("chunked_prefill_size", "chunked prefill size (effective)"), ("max_prefill_tokens", "max prefill tokens (effective)"))


@dataclass(slots=True)
class Side:
    """One diagnosed recording."""

    source: str
    timeline: Timeline
    report: Any
    doc: dict[str, Any]


def _busy(tl: Timeline, signal: str, stat: str) -> float | None:
    s = tl.get(signal)
    if s is None or not len(s):
        return None
    v = s.values[~np.isnan(s.values)]
    v = v[v > 0]
    if not len(v):
        return 0.0
    return float(np.median(v)) if stat == "median" else float(v.mean())


def _retractions(side: Side) -> int:
    from diagnoser.rules.base import RuleContext
    from diagnoser.rules.kv01_kv_saturation import retractions

    return retractions(RuleContext(side.timeline, {}, None))[0]


def _cache_hit(side: Side) -> float | None:
    """The prefix-cache hit rate over the window, as low_cache_hit reads it (cached / prefill tokens)."""
    from diagnoser.rules.base import RuleContext
    from diagnoser.rules.ca01_low_cache_hit import hit_rate

    return hit_rate(RuleContext(side.timeline, {}, None))[0]


def headline(side: Side) -> dict[str, float | None]:
    tl = side.timeline
    st = tl.stats
    wq = tl.meta.get("window_quantiles") or {}
    ttft = wq.get("ttft_seconds_p95")
    if ttft is None:
        ttft = st("ttft_seconds_p95")["max"]
    return {
        "running": _busy(tl, "running_reqs", "median"),
        "queued": st("queue_reqs")["p50"],
        "kv_usage": st("token_usage")["mean"],
        "gen_tps": _busy(tl, "gen_throughput_tps", "mean"),
        "ttft_p95_s": ttft,
        "cache_hit": _cache_hit(side),
        "retractions": float(_retractions(side)),
        "out_tps": window_rate(tl, "output_tps").value,
    }


HEADLINE_LABELS = {"running": "running (median while busy)", "queued": "queued (median)", "kv_usage": "KV usage (mean)",
                   "gen_tps": "gen tok/s (mean while busy)", "ttft_p95_s": "TTFT p95 s", "cache_hit": "prefix cache hit rate", "retractions": "retractions",
                   "out_tps": "out tok/s (over the window)"}
# which way is better for each headline number (+1 higher is better, -1 lower, 0 neither)
BETTER = {"running": 0, "queued": -1, "kv_usage": 0, "gen_tps": 1, "ttft_p95_s": -1, "cache_hit": 1, "retractions": -1, "out_tps": 1}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def flags_changed(a: Timeline, b: Timeline) -> list[dict[str, Any]]:
    from diagnoser.redact import redact

    out: list[dict[str, Any]] = []
    names = sorted({k[4:] for k in (*a.config, *b.config) if k.startswith("arg.")})
    for n in names:
        if n in IGNORED_ARGS:
            continue
        va, vb = a.cfg(f"arg.{n}"), b.cfg(f"arg.{n}")
        if va != vb and not (isinstance(va, dict) or isinstance(vb, dict)):
            out.append({"flag": _flag(n), "before": redact({n: va})[n], "after": redact({n: vb})[n], "kind": "server arg"})
    have = {d["flag"] for d in out}
    for name, label in EFFECTIVE:
        va, vb = a.cfg(name), b.cfg(name)
        if va != vb and va is not None and vb is not None:
            out.append({"flag": label, "before": va, "after": vb, "kind": "effective"})
    return [d for d in out if d["kind"] == "effective" or d["flag"] in have]


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def _realized(side: Side) -> dict[str, float | None]:
    """The numbers a projection predicts, read from AFTER the way the capacity model reads them."""
    from diagnoser.capacity.build import workload_from_timeline

    w = workload_from_timeline(side.timeline, {})
    pool = _num(side.timeline.cfg("max_total_tokens"))
    return {"pool_tokens": pool, "running": w.running, "gen_throughput_tps": w.gen_tps}


def _moved(before: float | None, after: float | None, tol: float = 0.05) -> int | None:
    """-1 / 0 / +1: how a number moved (within ``tol`` of the before value counts as not moved)."""
    if before is None or after is None:
        return None
    if abs(after - before) <= tol * max(abs(before), 1e-9):
        return 0
    return 1 if after > before else -1


def _applied(s: dict[str, Any], after: Timeline) -> tuple[str, Any]:
    name = s["flag"].lstrip("-").replace("-", "_")
    now = after.cfg(f"arg.{name}")
    if now is None:
        now = after.cfg(name)
    prop, cur = s.get("proposed"), s.get("current")
    if now is None:
        return ("unknown (AFTER does not show the flag)", None)
    pn, cn, nn = _num(prop), _num(cur), _num(now)
    if str(now).lower() == str(prop).lower() or (nn is not None and pn is not None and abs(nn - pn) <= 0.1 * max(abs(pn), 1e-9)):
        return "applied", now  # a sized value re-diagnosed from the recording may differ a little from the live one
    if pn is not None and cn is not None and nn is not None and nn != cn and (nn - cn) * (pn - cn) > 0:
        return "partly (same direction)", now
    return "not applied", now


# the headline numbers each rule's fix is meant to move, and which way (what its suggestions' effects say)
FIX_MOVES: dict[str, dict[str, int]] = {
    "kv_saturation": {"running": +1},
    "kv_retraction": {"retractions": -1},
    "max_running_requests_cap": {"running": +1, "queued": -1},
    "prefill_stall": {"ttft_p95_s": -1},
    "low_cache_hit": {"cache_hit": +1},  # the prefill work it saves; TTFT moves only as far as requests waited on prefill
    "cuda_graph_disabled_or_exceeded": {"gen_tps": +1},
    "prefill_decode_interference": {"gen_tps": +1},
    "low_spec_acceptance": {"gen_tps": +1},
}


def suggestion_rows(before: Side, after: Side) -> list[dict[str, Any]]:
    after_rules = {f.rule for f in after.report.findings if f.severity >= Severity.WARNING}
    realized = _realized(after)
    base = _realized(before)
    hb, ha = headline(before), headline(after)
    rows = []
    for f in before.report.findings:
        for s in f.suggestions:
            d = s.to_dict()
            status, now = _applied(d, after.timeline)
            proj = d.get("projection") or {}
            pred = {"pool_tokens": _num(proj.get("pool_tokens")), "running": _num(proj.get("projected_running")),
                    "gen_throughput_tps": _num(proj.get("projected_gen_throughput_tps"))}
            checks = []
            for k, p in pred.items():
                r, b0 = realized.get(k), base.get(k)
                want, got = _moved(b0, p), _moved(b0, r)
                # a number the projection leaves where it was is no claim (the change is not one it sizes)
                ok = None if want is None or got is None or want == 0 else want == got
                checks.append({"number": k, "before": b0, "predicted": p, "realized": r,
                               "predicted_move": want, "realized_move": got, "as_predicted": ok})
            for k, want in FIX_MOVES.get(f.rule, {}).items():
                if any(c["number"] == k and c["predicted"] is not None for c in checks):
                    continue  # the projection's own number for it is checked above
                b0, r = hb.get(k), ha.get(k)
                got = _moved(b0, r)
                checks.append({"number": k, "before": b0, "predicted": None, "realized": r, "predicted_move": want,
                               "realized_move": got, "as_predicted": None if got is None else got == want, "from": "the rule's fix"})
            judged = [c["as_predicted"] for c in checks if c["as_predicted"] is not None and c["predicted_move"]]
            verdict = ("not applied" if not status.startswith(("applied", "partly")) else
                       "no prediction to check" if not judged else
                       "as predicted" if all(judged) else "not as predicted" if not any(judged) else "partly as predicted")
            rows.append({"rule": f.rule, "flag": s.flag, "current": s.current, "proposed": s.proposed, "after": now,
                         "applied": status, "finding_resolved": f.rule not in after_rules if f.severity >= Severity.WARNING else None,
                         "checks": checks, "verdict": verdict, "confidence": proj.get("confidence")})
    return rows


def compare(before: Side, after: Side) -> dict[str, Any]:
    hb, ha = headline(before), headline(after)
    heads = []
    for k in HEADLINE_LABELS:
        b, a = hb.get(k), ha.get(k)
        rel = None if b in (None, 0) or a is None else a / b - 1  # type: ignore[operator]
        move = _moved(b, a)
        judgement = None if move is None or BETTER[k] == 0 or move == 0 else ("better" if move == BETTER[k] else "worse")
        heads.append({"name": k, "label": HEADLINE_LABELS[k], "before": b, "after": a, "change": rel, "judgement": judgement})
    fb = {f.rule: f for f in before.report.findings}
    fa = {f.rule: f for f in after.report.findings}
    serious = Severity.WARNING

    def brief(f: Any) -> dict[str, Any]:
        return {"rule": f.rule, "severity": f.severity.label, "confidence": f.confidence, "summary": f.summary}

    resolved = [brief(f) for r, f in fb.items() if r not in fa or (f.severity >= serious > fa[r].severity)]
    persisting = [brief(fa[r]) for r in fb if r in fa and not (fb[r].severity >= serious > fa[r].severity)]
    new = [brief(f) for r, f in fa.items() if r not in fb]
    top_b, sug_b = top_cause(before.report.findings, before.timeline.target)
    top_a, _ = top_cause(after.report.findings, after.timeline.target)
    top_resolved = top_b is not None and top_b.severity >= serious and not any(x["rule"] == top_b.rule for x in persisting if x["severity"] != "info")
    regressed = [x for x in new if x["severity"] != "info"]
    worse = [h["name"] for h in heads if h["judgement"] == "worse" and h["change"] is not None and abs(h["change"]) > 0.1]
    if regressed:
        verdict = "regressed"
    elif (top_resolved or (resolved and not persisting)) and not worse:
        verdict = "improved"
    elif resolved or top_resolved:
        verdict = "mixed"
    else:
        verdict = "no change" if not worse else "regressed"
    return {
        "before": {"source": before.source, "window": before.doc.get("window"), "version": before.doc.get("version"),
                   "top": None if top_b is None else top_b.rule, "top_suggestion": None if sug_b is None else
                   {"flag": sug_b.flag, "current": sug_b.current, "proposed": sug_b.proposed}},
        "after": {"source": after.source, "window": after.doc.get("window"), "version": after.doc.get("version"),
                  "top": None if top_a is None else top_a.rule},
        "flags_changed": flags_changed(before.timeline, after.timeline),
        "headline": heads,
        "findings": {"resolved": resolved, "persisting": persisting, "new": new},
        "top_resolved": top_resolved,
        "suggestions": suggestion_rows(before, after),
        "verdict": verdict,
    }


def _fmt(v: Any, k: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if k in ("kv_usage",):
            return f"{v:.2f}"
        if k == "cache_hit":
            return f"{v:.0%}"
        if k == "ttft_p95_s":
            return f"{v:.2f}"
        return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.1f}"
    return str(v)


def render(doc: dict[str, Any]) -> str:
    from diagnoser.outputs.term import columns
    from diagnoser.outputs.text import _wrap as _wrap80

    WIDTH = columns()  # noqa: N806 — the terminal's width (outputs/term), as the text report

    def _wrap(text: str, indent: str = "  ", first: str | None = None) -> list[str]:
        return _wrap80(text, indent, first, WIDTH)

    out = [f"diagnoser compare · verdict: {doc['verdict'].upper()}", f"before {doc['before']['source']}",
           f"after  {doc['after']['source']}", ""]
    out.append("Flags changed")
    if doc["flags_changed"]:
        for c in doc["flags_changed"]:
            out.append(f"  {c['flag']}: {_fmt(c['before'])} → {_fmt(c['after'])}"[:WIDTH])
    else:
        out.append("  none (the server args are the same, or not in the recordings)")
    out += ["", f"  {'':30} {'before':>10} {'after':>10} {'change':>8}"]
    for h in doc["headline"]:
        ch = "" if h["change"] is None else f"{h['change']:+.0%}"
        mark = {"better": " better", "worse": " WORSE"}.get(h["judgement"] or "", "")
        out.append(f"  {h['label']:30} {_fmt(h['before'], h['name']):>10} {_fmt(h['after'], h['name']):>10} {ch:>8}{mark}"[:WIDTH])
    out.append("")
    f = doc["findings"]
    for key, title in (("resolved", "Resolved"), ("persisting", "Still there"), ("new", "New")):
        if f[key]:
            out.append(f"{title} ({len(f[key])})")
            for x in f[key]:
                out.extend(_wrap(f"{x['rule']} ({x['severity']}): {x['summary']}", "      ", "    "))
    if not any(f.values()):
        out.append("No finding before or after.")
    out.append("")
    rows = doc["suggestions"]
    if rows:
        out.append("Suggestions made on BEFORE: predicted vs realized")
        for r in rows:
            head = (f"{r['flag']} {_fmt(r['current'])} → {_fmt(r['proposed'])} ({r['rule']}): {r['applied']}"
                    + (f" [AFTER has {_fmt(r['after'])}]" if r["applied"].startswith("partly") else "")
                    + (f"; {r['rule']} resolved" if r["finding_resolved"] else f"; {r['rule']} still there" if r["finding_resolved"] is False else ""))
            out.extend(_wrap(head, "      ", "  · "))
            out.append(f"      {'':11} {'before':>7}   {'predicted':>9}   {'realized':>8}  as predicted")
            for c in r["checks"]:
                ok = {True: "yes", False: "NO", None: "-"}[c["as_predicted"]]
                if c["predicted"] is not None:
                    pred = _fmt(c["predicted"], c["number"])
                elif c["predicted_move"]:
                    pred = "lower" if c["predicted_move"] < 0 else "higher"
                else:
                    continue
                out.append(f"      {c['number'][:11]:11} {_fmt(c['before'], c['number']):>7} → {pred:>9} · {_fmt(c['realized'], c['number']):>8}  {ok}"[:WIDTH])
            out.append(f"      verdict: {r['verdict']}")
    else:
        out.append("No suggestion was made on BEFORE.")
    return "\n".join(out).rstrip() + "\n"


__all__ = ["Side", "compare", "headline", "render"]
