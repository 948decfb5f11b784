"""``diagnose compare BEFORE AFTER``: judge a change, like a canary analysis.

Both recordings (bundles or run directories) are diagnosed as ``diagnose --once --replay`` would; then:

* the flags that changed (server args, and the effective pool / slot cap / chunk sizes the engine printed);
* the headline numbers before and after: running (median while busy), queued (median), KV usage (mean),
  gen tok/s (mean while busy), TTFT p95 (over the window), prefix-cache hit rate, retractions, with the
  change: relative for counts, throughputs and times, in percentage points for rates (KV usage, hit rate:
  2.7 % → 3.1 % is +0.4 pt, not +15 %);
* which findings resolved, which stayed, which are new;
* for each suggestion made on BEFORE: whether AFTER applied it (its flag differs between BEFORE and AFTER
  and has the proposed value, or moved towards it), and, for an applied one only, predicted vs realized
  for the numbers its projection gave (pool tokens, running requests, gen throughput) and the headline
  number its rule's fix moves, with whether each moved the predicted way. The realized numbers are read
  from the decode readings the projection's were: the running batch as a level (the median decode batch:
  a cap holds the typical batch at its value, churn keeps the mean a little under it) and throughput as
  the capacity model's mean, so the two compare. A predicted move is read from the projection's own
  anchor (the mean batch it started from), a realized one from BEFORE's level.

The verdict judges the change that was made: a new finding at warning or above is a regression; else it
follows the applied suggestions (did their findings resolve, did their predicted numbers move as
predicted); when no suggestion was applied, the findings alone. Other headline movements (a hit rate
that moved while the pool was changed) are listed beside it, never folded into it.
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

# vLLM: its own spellings of what the effective values are, and the args that only name the launch
EFFECTIVE_VLLM = (("max_total_tokens", "KV cache size (tokens, effective)"), ("num_gpu_blocks", "KV blocks (effective)"),
                  ("kv_max_concurrency", "maximum concurrency (effective)"))
VLLM_IGNORED_ARGS = frozenset({"model", "tokenizer", "served_model_name", "download_dir", "kv_cache_metrics", "kv_cache_metrics_sample",
                               "uvicorn_log_level", "disable_log_requests", "enable_log_requests"})


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
SHORT = {"running": "running", "queued": "queued", "kv_usage": "KV usage", "gen_tps": "gen tok/s", "ttft_p95_s": "TTFT p95 (s)",
         "cache_hit": "prefix cache hit rate", "retractions": "retractions", "out_tps": "out tok/s"}
# headline numbers that are fractions (0..1): their change is in percentage points, and a movement
# within RATE_TOL of the before value is no movement (a relative tolerance calls 2.7 % -> 3.1 % a change)
RATES = frozenset({"kv_usage", "cache_hit"})
RATE_TOL = 0.02
# which way is better for each headline number (+1 higher is better, -1 lower, 0 neither)
BETTER = {"running": 0, "queued": -1, "kv_usage": 0, "gen_tps": 1, "ttft_p95_s": -1, "cache_hit": 1, "retractions": -1, "out_tps": 1}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def engine_of(tl: Timeline) -> str:
    return str(getattr(tl, "engine", None) or "sglang")


def server_args(tl: Timeline) -> dict[str, Any]:
    """The server's flags as recorded: SGLang's ``arg.*`` config facts; for vLLM the ``non-default args``
    start-up line (an arg it does not list is at vLLM's default)."""
    out = {k[4:]: tl.cfg(k) for k in tl.config if k.startswith("arg.")}
    if engine_of(tl) == "vllm":
        for ev in tl.events_of("server_args"):
            out.update({k: v for k, v in (ev.fields.get("args") or {}).items() if isinstance(k, str)})
    return out


def flags_changed(a: Timeline, b: Timeline) -> list[dict[str, Any]]:
    from diagnoser.redact import redact

    out: list[dict[str, Any]] = []
    aa, ab = server_args(a), server_args(b)
    vllm = engine_of(a) == "vllm" and engine_of(b) == "vllm"
    for n in sorted({*aa, *ab}):
        if n in IGNORED_ARGS or (vllm and n in VLLM_IGNORED_ARGS):
            continue
        va, vb = aa.get(n), ab.get(n)
        if vllm and (va is None) != (vb is None):
            va, vb = ("default" if va is None else va), ("default" if vb is None else vb)
        if va != vb and not (isinstance(va, dict) or isinstance(vb, dict)):
            out.append({"flag": _flag(n), "before": redact({n: va})[n], "after": redact({n: vb})[n], "kind": "server arg"})
    have = {d["flag"] for d in out}
    for name, label in (EFFECTIVE_VLLM if vllm else EFFECTIVE):
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
    """The numbers a projection predicts, read from AFTER (or BEFORE, to compare) from the readings the
    capacity model reads."""
    return _readings(side)[0]


def _readings(side: Side) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(levels, anchors) of one recording. Levels are what compare judges: running as the typical decode
    batch (the median: a cap holds it at its value, while churn around the cap keeps the mean a little
    under it, a finished request's slot waiting a step or two for the next prefill) and throughput as its
    mean (a rate). Anchors are what the projection started from (the capacity model's mean batch): a
    projection's predicted move is read against its own anchor, a realized move against the level."""
    from diagnoser.capacity.build import workload_from_timeline
    from diagnoser.capacity.throughput import decode_points

    tl = side.timeline
    bs, xs = decode_points(tl)
    w = workload_from_timeline(tl, {}, points=(bs, xs))
    pool = _num(tl.cfg("max_total_tokens"))
    running = float(np.median(bs)) if bs else _busy(tl, "running_reqs", "median")
    levels = {"pool_tokens": pool, "running": running, "gen_throughput_tps": w.gen_tps}
    return levels, {**levels, "running": w.running if w.running is not None else running}


def _moved(before: float | None, after: float | None, tol: float = 0.05, rate: bool = False) -> int | None:
    """-1 / 0 / +1: how a number moved (within ``tol`` of the before value, or for a rate within
    RATE_TOL of it in absolute terms, counts as not moved)."""
    if before is None or after is None:
        return None
    if abs(after - before) <= (RATE_TOL if rate else tol * max(abs(before), 1e-9)):
        return 0
    return 1 if after > before else -1


def _value(tl: Timeline, name: str) -> Any:
    v = tl.cfg(f"arg.{name}")
    if v is None and engine_of(tl) == "vllm":
        v = server_args(tl).get(name)
    return tl.cfg(name) if v is None else v


def _same(a: Any, b: Any) -> bool:
    na, nb = _num(a), _num(b)
    if na is not None and nb is not None:
        return na == nb
    return str(a).lower() == str(b).lower()


APPLIED = ("applied", "partly (same direction)")


def _applied(s: dict[str, Any], before: Timeline, after: Timeline) -> tuple[str, Any]:
    """Whether AFTER carries the suggestion: its flag changed between the two recordings and has the
    proposed value (or moved from the current value towards it)."""
    name = s["flag"].lstrip("-").replace("-", "_")
    now = _value(after, name)
    prop, cur = s.get("proposed"), s.get("current")
    if now is None:
        return ("unknown (AFTER does not show the flag)", None)
    was = _value(before, name)
    if was is None:
        was = cur  # BEFORE does not show it: the suggestion's current value is what the rule read
    if was is not None and _same(was, now):
        return "not applied", now  # the flag is the same in both recordings, whatever it is
    pn, nn = _num(prop), _num(now)
    cn = _num(was) if _num(was) is not None else _num(cur)
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
    base, anchor = _readings(before)
    hb, ha = headline(before), headline(after)
    rows = []
    for f in before.report.findings:
        for s in f.suggestions:
            d = s.to_dict()
            status, now = _applied(d, before.timeline, after.timeline)
            applied = status in APPLIED
            proj = d.get("projection") or {}
            pred = {"pool_tokens": _num(proj.get("pool_tokens")), "running": _num(proj.get("projected_running")),
                    "gen_throughput_tps": _num(proj.get("projected_gen_throughput_tps"))}
            checks = []
            for k, p in pred.items():
                r, b0 = realized.get(k), base.get(k)
                # the projection moved its own anchor (a mean batch of 22 kept at 22 is no claim, though the
                # median batch was 30); the recordings' move is level to level
                a0 = anchor.get(k) if anchor.get(k) is not None else b0
                want, got = _moved(a0, p), _moved(b0, r)
                # a number the projection leaves where it was is no claim (the change is not one it sizes);
                # a suggestion AFTER did not apply is not judged at all
                ok = None if not applied or want is None or got is None or want == 0 else want == got
                checks.append({"number": k, "before": b0, "predicted": p, "realized": r,
                               "predicted_move": want, "realized_move": got, "as_predicted": ok})
            for k, want in FIX_MOVES.get(f.rule, {}).items():
                if any(c["number"] == k and c["predicted"] is not None for c in checks):
                    continue  # the projection's own number for it is checked above
                b0, r = hb.get(k), ha.get(k)
                got = _moved(b0, r, rate=k in RATES)
                checks.append({"number": k, "before": b0, "predicted": None, "realized": r, "predicted_move": want,
                               "realized_move": got, "as_predicted": None if not applied or got is None else got == want,
                               "from": "the rule's fix"})
            judged = [c["as_predicted"] for c in checks if c["as_predicted"] is not None and c["predicted_move"]]
            verdict = ("not applied" if status == "not applied" else "not judged" if not applied else
                       "no prediction to check" if not judged else
                       "as predicted" if all(judged) else "not as predicted" if not any(judged) else "partly as predicted")
            rows.append({"rule": f.rule, "flag": s.flag, "current": s.current, "proposed": s.proposed, "after": now,
                         "applied": status, "finding_resolved": f.rule not in after_rules if f.severity >= Severity.WARNING else None,
                         "checks": checks, "verdict": verdict, "confidence": proj.get("confidence")})
    return rows


# the number a suggestion check names, as the headline calls it
CHECK_HEADLINE = {"running": "running", "gen_throughput_tps": "gen_tps"}
CHECK_LABELS = {"pool_tokens": "pool tokens", "running": "running", "gen_throughput_tps": "gen tok/s"}


def _serious(x: dict[str, Any]) -> bool:
    return Severity.parse(x["severity"]) >= Severity.WARNING


def _check_text(c: dict[str, Any]) -> str:
    k = c["number"]
    label = CHECK_LABELS.get(k) or SHORT.get(k, k)
    text = f"{label} {_fmt(c['before'], k)} → {_fmt(c['realized'], k)}"
    if c["as_predicted"]:
        return text + " as predicted"
    want = _fmt(c["predicted"], k) if c["predicted"] is not None else ("higher" if (c["predicted_move"] or 0) > 0 else "lower")
    return text + f", not as predicted ({want})"


def judge(rows: list[dict[str, Any]], findings: dict[str, list[dict[str, Any]]], changed: list[dict[str, Any]],
          heads: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on the change, what it rests on, and what moved beside it.

    A new finding at warning or above is a regression, unless BEFORE named it as the limit that binds after
    the applied change (a compound limit whose second change was not applied). Else the applied suggestions decide: each one's
    finding resolved (or not) and each of its checks as predicted (or not); all for → improved, some →
    mixed, none → not improved. With no suggestion applied, the findings at warning or above decide
    (resolved and none left → improved). Headline numbers outside the applied suggestions' checks are
    reported as other movements and never change the verdict."""
    applied = [r for r in rows if r["applied"] in APPLIED]
    # a compound limit: BEFORE's finding gave a first change and the limit that binds after it; a new finding
    # on that next limit, its change not applied, is the projection coming true, not a regression
    fixed = {r["rule"] for r in applied}
    next_flags = {r["flag"] for r in rows if r["rule"] in fixed and r["applied"] not in APPLIED}
    expected = [x for x in findings["new"] if _serious(x) and set(x.get("flags") or ()) & next_flags]
    regressed = [x for x in findings["new"] if _serious(x) and x not in expected]
    args = [c["flag"] for c in changed if c["kind"] == "server arg"]
    others = [f for f in args if f not in {r["flag"] for r in applied}]
    reasons: list[str] = [f"new {x['rule']} ({x['severity']})" for x in regressed]
    reasons += [f"new {x['rule']} ({x['severity']}): the limit BEFORE said binds next "
                f"({', '.join(sorted(set(x.get('flags') or ()) & next_flags))}, not applied)" for x in expected]
    good: list[str] = []
    bad: list[str] = []
    judged: set[str] = set()
    seen: set[str] = set()
    for r in applied:
        if r["rule"] not in seen:
            seen.add(r["rule"])
            if r["finding_resolved"] is True:
                good.append(f"{r['rule']} resolved")
            elif r["finding_resolved"] is False:
                bad.append(f"{r['rule']} still there")
        for c in r["checks"]:
            if c["as_predicted"] is None:
                continue
            judged.add(CHECK_HEADLINE.get(c["number"], c["number"]))
            (good if c["as_predicted"] else bad).append(_check_text(c))
    if regressed:
        verdict = "regressed"
    elif applied:
        verdict = "improved" if good and not bad else "mixed" if good else "not improved" if bad else "not judged"
    else:
        rs = [x for x in findings["resolved"] if _serious(x)]
        ps = [x for x in findings["persisting"] if _serious(x)]
        good, bad = [f"{x['rule']} resolved" for x in rs], [f"{x['rule']} still there" for x in ps]
        verdict = "improved" if rs and not ps else "mixed" if rs else "no change"
    reasons += good + bad
    if not applied:
        reasons.append("no suggestion made on BEFORE was applied" + (f" (changed: {', '.join(args)})" if args else
                                                                      "; no server flag differs between the recordings"))
        if not good and not bad and not regressed:
            reasons.append("no finding at warning or above before or after")
    else:
        left = [x for x in findings["persisting"] if _serious(x) and x["rule"] not in seen]
        if left:
            reasons.append("still there, not what the change addressed: " + ", ".join(f"{x['rule']} ({x['severity']})" for x in left))
        if others:
            reasons.append(f"also changed, not suggested: {', '.join(others)} (its effect is mixed into the result)")
    moved = [h["name"] for h in heads if h["name"] not in judged and h["move"]]
    return {"verdict": verdict, "reasons": reasons, "applied": [r["flag"] for r in applied], "other_flags": others,
            "other_movements": moved}


def headline_rows(hb: dict[str, float | None], ha: dict[str, float | None]) -> list[dict[str, Any]]:
    """Each headline number before and after, its change (relative, or in points for a rate), how it moved
    and whether that is better or worse."""
    heads = []
    for k in HEADLINE_LABELS:
        b, a = hb.get(k), ha.get(k)
        rate = k in RATES
        rel = None if rate or b in (None, 0) or a is None else a / b - 1  # type: ignore[operator]
        points = None if not rate or a is None or b is None else (a - b) * 100
        move = _moved(b, a, rate=rate)
        judgement = None if move is None or BETTER[k] == 0 or move == 0 else ("better" if move == BETTER[k] else "worse")
        heads.append({"name": k, "label": HEADLINE_LABELS[k], "before": b, "after": a, "change": rel, "change_points": points,
                      "move": move, "judgement": judgement})
    return heads


def compare(before: Side, after: Side) -> dict[str, Any]:
    heads = headline_rows(headline(before), headline(after))
    fb = {f.rule: f for f in before.report.findings}
    fa = {f.rule: f for f in after.report.findings}
    serious = Severity.WARNING

    def brief(f: Any) -> dict[str, Any]:
        return {"rule": f.rule, "severity": f.severity.label, "confidence": f.confidence, "summary": f.summary}

    resolved = [brief(f) for r, f in fb.items() if r not in fa or (f.severity >= serious > fa[r].severity)]
    persisting = [brief(fa[r]) for r in fb if r in fa and not (fb[r].severity >= serious > fa[r].severity)]
    new = [brief(f) | {"flags": [x.flag for x in f.suggestions]} for r, f in fa.items() if r not in fb]
    top_b, sug_b = top_cause(before.report.findings, before.timeline.target)
    top_a, _ = top_cause(after.report.findings, after.timeline.target)
    top_resolved = top_b is not None and top_b.severity >= serious and not any(x["rule"] == top_b.rule for x in persisting if x["severity"] != "info")
    changed = flags_changed(before.timeline, after.timeline)
    findings = {"resolved": resolved, "persisting": persisting, "new": new}
    rows = suggestion_rows(before, after)
    j = judge(rows, findings, changed, heads)
    engines = {"before": engine_of(before.timeline), "after": engine_of(after.timeline)}
    if "vllm" in engines.values():
        for h in heads:
            if h["name"] == "retractions":
                h["label"] = "preemptions"
    return {
        "engine": engines["before"] if engines["before"] == engines["after"] else None,
        "engines": engines,
        "before": {"source": before.source, "window": before.doc.get("window"), "version": before.doc.get("version"),
                   "top": None if top_b is None else top_b.rule, "top_suggestion": None if sug_b is None else
                   {"flag": sug_b.flag, "current": sug_b.current, "proposed": sug_b.proposed}},
        "after": {"source": after.source, "window": after.doc.get("window"), "version": after.doc.get("version"),
                  "top": None if top_a is None else top_a.rule},
        "flags_changed": changed,
        "headline": heads,
        "findings": findings,
        "top_resolved": top_resolved,
        "suggestions": rows,
        "verdict": j["verdict"],
        "verdict_basis": {k: v for k, v in j.items() if k != "verdict"},
    }


def _fmt(v: Any, k: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not k:
            return f"{v:g}"  # a flag's value as set (0.716, not 0.7)
        if k in ("kv_usage",):
            return f"{v:.2f}"
        if k == "cache_hit":
            return f"{v:.1%}" if 0 < v < 0.1 else f"{v:.0%}"
        if k == "ttft_p95_s":
            return f"{v:.2f}"
        return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.1f}"
    return str(v)


def _change(h: dict[str, Any]) -> str:
    if h.get("change_points") is not None:
        pt = h["change_points"]
        if h["move"] == 0:
            return f"{pt:+.1f} pt" if abs(pt) >= 0.05 else ""
        return f"{pt:+.0f} pt" if abs(pt) >= 10 else f"{pt:+.1f} pt"
    return "" if h["change"] is None else f"{h['change']:+.0%}"


def _path_lines(first: str, path: str, width: int) -> list[str]:
    """A path on as many lines as it needs, broken after a ``/`` (never inside a name)."""
    lines, cur = [], first
    for part in path.replace("/", "/\0").split("\0"):
        if len(cur) + len(part) > width and cur.strip():
            lines.append(cur)
            cur = " " * len(first)
        cur += part
    return [*lines, cur]


def render(doc: dict[str, Any]) -> str:
    """The text of a comparison (one function, so the terminal's width and colour rules apply in one place)."""
    from diagnoser.outputs.term import columns
    from diagnoser.outputs.text import _wrap as _wrap80

    WIDTH = columns()  # noqa: N806 — the terminal's width (outputs/term), as the text report

    def _wrap(text: str, indent: str = "  ", first: str | None = None) -> list[str]:
        return _wrap80(text, indent, first, WIDTH)

    basis = doc.get("verdict_basis") or {}
    eng = doc.get("engines") or {}
    names = {"sglang": "SGLang", "vllm": "vLLM"}
    if eng and eng.get("before") == eng.get("after"):
        version = (doc["before"].get("version") or "") if doc["before"].get("version") == doc["after"].get("version") else ""
        engine = names.get(eng["before"], eng["before"]) + (f" {version}" if version and version[0].isdigit() else "")
    else:
        engine = f"{names.get(eng.get('before', ''), eng.get('before'))} → {names.get(eng.get('after', ''), eng.get('after'))}"
    out = [f"diagnoser compare · {engine} · verdict: {doc['verdict'].upper()}"]
    for reason in basis.get("reasons") or ():
        out.extend(_wrap(reason, "      ", "  · "))
    heads = {h["name"]: h for h in doc["headline"]}
    moved = [heads[n] for n in basis.get("other_movements") or () if n in heads]
    if moved:
        worse = [f"{SHORT.get(h['name'], h['name'])} {_fmt(h['before'], h['name'])} → {_fmt(h['after'], h['name'])} ({_change(h).strip()})"
                 for h in moved if h["judgement"] == "worse"]
        rest = len(moved) - len(worse)
        text = "not in the verdict: " + "; ".join(worse + ([f"{rest} other number(s) moved"] if rest else [])) + " (the table below)"
        out.extend(_wrap(text, "      ", "  · "))
    for label in ("before", "after"):
        out.extend(_path_lines(f"{label:6} ", str(doc[label]["source"]), WIDTH))
    out.append("")
    out.append("Flags changed")
    if doc["flags_changed"]:
        for c in doc["flags_changed"]:
            out.extend(_wrap(f"{c['flag']}: {_fmt(c['before'])} → {_fmt(c['after'])}", "      ", "  "))
    else:
        out.append("  none (the server args are the same, or not in the recordings)")
    out += ["", f"  {'':30} {'before':>10} {'after':>10} {'change':>8}"]
    for h in doc["headline"]:
        mark = {"better": " better", "worse": " worse"}.get(h["judgement"] or "", "")
        row = f"  {h['label']:30} {_fmt(h['before'], h['name']):>10} {_fmt(h['after'], h['name']):>10} {_change(h):>8}{mark}"
        out.extend([row] if len(row) <= WIDTH else _wrap(row.strip(), "      ", "  "))  # a narrow terminal: wrapped, never cut
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
        out.append("Suggestions made on BEFORE: predicted vs realized (applied ones)")
        for r in rows:
            applied = r["applied"] in APPLIED
            head = (f"{r['flag']} {_fmt(r['current'])} → {_fmt(r['proposed'])} ({r['rule']}): {r['applied']}"
                    + (f" [AFTER has {_fmt(r['after'])}]" if r["applied"].startswith("partly") else "")
                    + (f"; {r['rule']} resolved" if r["finding_resolved"] else f"; {r['rule']} still there" if r["finding_resolved"] is False else ""))
            out.extend(_wrap(head, "      ", "  · "))
            if not applied:
                continue  # nothing of it is judged: the numbers moved for another reason
            out.append(f"      {'':11} {'before':>7}   {'predicted':>9}   {'realized':>8}  as predicted")
            for c in r["checks"]:
                ok = {True: "yes", False: "NO", None: "-"}[c["as_predicted"]]
                if c["predicted"] is not None and c["predicted_move"] == 0:
                    pred = "same"  # the projection keeps it where it was (read from its own anchor)
                elif c["predicted"] is not None:
                    pred = _fmt(c["predicted"], c["number"])
                elif c["predicted_move"]:
                    pred = "lower" if c["predicted_move"] < 0 else "higher"
                else:
                    continue
                row = f"      {c['number'][:11]:11} {_fmt(c['before'], c['number']):>7} → {pred:>9} · {_fmt(c['realized'], c['number']):>8}  {ok}"
                out.extend([row] if len(row) <= WIDTH else _wrap(row.strip(), "        ", "      "))
            out.append(f"      verdict: {r['verdict']}")
    else:
        out.append("No suggestion was made on BEFORE.")
    return "\n".join(out).rstrip() + "\n"


__all__ = ["Side", "compare", "headline", "headline_rows", "judge", "render"]
