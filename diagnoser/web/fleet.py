"""The fleet overview page (``/fleet``, JSON twin ``/fleet.json``) and the Prometheus-fed monitor behind
``diagnose serve --prometheus``.

The page lists every target of the current snapshot in one table that stays usable with hundreds of
targets: sorted, filtered and paginated on the server (plain GET parameters, no script needed), with
the fleet findings (replica_imbalance, config_drift) and the fleet capacity summary on top. Every
string from a server or a Prometheus label is escaped by Jinja2; the page fetches nothing a visitor
chooses.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from diagnoser.fleet import collect_prometheus
from diagnoser.fleet.capacity import loads, summarize
from diagnoser.live import LiveMonitor, LiveTarget
from diagnoser.web.views import ENGINE_NAMES, fmt, health

PER_PAGE = (25, 50, 100, 200)
DEFAULT_PER = 50
HEALTH = ("critical", "warning", "ok", "down", "starting")
SEV = {"critical": 3, "warning": 2, "info": 1}
# column key → (header, signal in TargetView.latest or a row field, number format)
COLUMNS: dict[str, tuple[str, str, str]] = {
    "name": ("target", "", ""),
    "model": ("model", "", ""),
    "health": ("health", "", ""),
    "running": ("running", "running_reqs", "{:.0f}"),
    "queue": ("queued", "queue_reqs", "{:.0f}"),
    "usage": ("KV usage", "token_usage", "{:.2f}"),
    "gen": ("gen tok/s", "gen_throughput_tps", "{:,.0f}"),
    "ttft": ("TTFT p95 s", "ttft_seconds_p95", "{:.2f}"),
    "findings": ("findings", "", ""),
}
HEALTH_ORDER = {"critical": 4, "warning": 3, "down": 2, "starting": 1, "ok": 0}


def _params(request: Request) -> dict[str, Any]:
    q = request.query_params
    sort = q.get("sort", "health")
    sort = sort if sort in COLUMNS else "health"
    order = "asc" if q.get("order") == "asc" else "desc"
    try:
        per = int(q.get("per", DEFAULT_PER))
    except ValueError:
        per = DEFAULT_PER
    per = min(PER_PAGE, key=lambda p: abs(p - per))
    try:
        page = max(1, int(q.get("page", 1)))
    except ValueError:
        page = 1
    text = (q.get("q") or "")[:200]
    hl = q.get("health", "")
    return {"sort": sort, "order": order, "per": per, "page": page, "q": text, "health": hl if hl in HEALTH else ""}


def _row(t: Any, findings: list[Any]) -> dict[str, Any]:
    firing = [f for f in findings if f.state == "firing"]
    worst = max((int(f.severity) for f in firing), default=0)
    row: dict[str, Any] = {"id": t.index, "name": t.name, "page": f"/target/{t.index}", "model": t.model_name,
                           "health": health(t, findings), "version": t.version, "engine": getattr(t, "engine", "sglang"),
                           "engine_name": ENGINE_NAMES.get(getattr(t, "engine", "sglang"), "SGLang"), "findings": len(firing),
                           "worst": {3: "critical", 2: "warning", 1: "info"}.get(worst, ""),
                           "rules": sorted({f.rule for f in firing})}
    for key, (_h, sig, f) in COLUMNS.items():
        if sig:
            v = t.latest.get(sig)
            row[key] = v if v is not None and v == v else None
            row[key + "_text"] = fmt(f, v) if v is not None else "–"
    return row


def _sort_key(key: str) -> Any:
    def k(r: dict[str, Any]) -> Any:
        v = r.get(key)
        if key == "health":
            return (HEALTH_ORDER.get(r["health"], 0), r["findings"])
        if key == "findings":
            return (SEV.get(r["worst"], 0), r["findings"])
        if isinstance(v, str):
            return v.casefold()
        return -1e300 if v is None else v
    return k


def fleet_doc(snapshot: Any, p: dict[str, Any], capacity: dict[str, Any] | None = None, messages: list[str] | None = None) -> dict[str, Any]:
    rows = [_row(t, snapshot.for_target(t.name)) for t in snapshot.targets]
    counts = {h: sum(1 for r in rows if r["health"] == h) for h in HEALTH}
    needle = p["q"].casefold()
    matched = [r for r in rows if (not needle or needle in r["name"].casefold() or needle in (r["model"] or "").casefold())
               and (not p["health"] or r["health"] == p["health"])]
    matched.sort(key=lambda r: r["name"].casefold())
    matched.sort(key=_sort_key(p["sort"]), reverse=p["order"] == "desc")
    pages = max(1, -(-len(matched) // p["per"]))
    page = min(p["page"], pages)
    shown = matched[(page - 1) * p["per"]: page * p["per"]]

    def link(**kw: Any) -> str:
        q = {k: v for k, v in {**p, "page": page, **kw}.items() if v not in ("", None)}
        return "/fleet?" + urlencode(q)

    headers = []
    for key, (title, _s, _f) in COLUMNS.items():
        flip = "asc" if p["sort"] == key and p["order"] == "desc" else "desc"
        headers.append({"key": key, "title": title, "href": link(sort=key, order=flip, page=1),
                        "active": p["sort"] == key, "order": p["order"]})
    fleet_findings = [{"rule": f.rule, "severity": f.severity.label, "state": f.state, "target": f.target, "summary": f.summary,
                       "notes": list(f.notes)} for f in snapshot.findings if f.target.startswith("fleet/")]
    fleet_findings.sort(key=lambda f: -SEV.get(f["severity"], 0))
    totals = {k: fmt("{:,.0f}", sum(r[k] for r in rows if r.get(k) is not None)) if any(r.get(k) is not None for r in rows) else None
              for k in ("running", "queue", "gen")}
    return {
        "tick": snapshot.tick, "total": len(rows), "matched": len(matched), "page": page, "pages": pages, "per": p["per"],
        "sort": p["sort"], "order": p["order"], "q": p["q"], "health": p["health"], "counts": counts, "totals": totals,
        "rows": shown, "headers": headers, "fleet_findings": fleet_findings, "per_options": list(PER_PAGE),
        "health_options": list(HEALTH),
        "prev": link(page=page - 1) if page > 1 else None, "next": link(page=page + 1) if page < pages else None,
        "first": link(page=1) if page > 1 else None, "last": link(page=pages) if page < pages else None,
        "capacity": _capacity(capacity), "messages": list(messages or [])[:10],
        "fragment": "/_/fleet?" + urlencode({k: v for k, v in {**p, "page": page}.items() if v not in ("", None)}),
    }


def _capacity(c: dict[str, Any] | None) -> dict[str, Any] | None:
    if not c:
        return None
    return {"pool": fmt("{:,.0f}", c.get("pool_tokens")), "usage": fmt("{:.0%}", c.get("token_usage")),
            "headroom": fmt("{:,.0f}", c.get("headroom_requests")), "known": c.get("headroom_known_targets"),
            "targets": c.get("targets"), "raw": c}


def _doc(monitor: Any, request: Request) -> dict[str, Any]:
    return fleet_doc(monitor.snapshot, _params(request), getattr(monitor, "capacity", None), getattr(monitor, "fleet_messages", None))


def router(monitor: Any, page: Any, as_json: Any) -> APIRouter:
    """``/fleet`` (HTML), ``/fleet.json`` and the live fragment ``/_/fleet``."""
    r = APIRouter()

    @r.get("/fleet", response_class=HTMLResponse)
    @r.get("/fleet.json")
    def fleet(request: Request) -> Any:
        doc = _doc(monitor, request)
        accept = request.headers.get("accept", "")
        if request.url.path.endswith(".json") or ("application/json" in accept and "text/html" not in accept):
            return as_json(doc)
        return page(request, "fleet.html", {"doc": doc, "title": "Fleet"})

    @r.get("/_/fleet", response_class=HTMLResponse)
    def fragment(request: Request) -> Any:
        return page(request, "_fleet.html", {"doc": _doc(monitor, request)})

    return r


# -- the Prometheus-fed monitor (diagnose serve --prometheus) ------------------------------------------
class FleetMonitor(LiveMonitor):
    """A LiveMonitor whose targets come from Prometheus: each poll reads the last window of every target
    (one query per signal for the whole fleet) and replaces the targets' timelines; Prometheus keeps
    the history, so nothing is scraped twice."""

    def __init__(self, adapter: Any, prom_args: argparse.Namespace, **kw: Any) -> None:
        super().__init__(adapter, [], [], **kw)
        self.prom_args = prom_args
        self.by_name: dict[str, LiveTarget] = {}
        self.fleet_messages: list[str] = []
        self.capacity: dict[str, Any] | None = None
        self.pass_problem = ""  # the last pass failed as a whole (Prometheus unreachable, hung, past its deadline)

    def health(self) -> tuple[bool, str]:
        ok, problem = super().health()
        if ok and self.pass_problem:
            return False, f"Reading Prometheus failed on the last poll: {self.pass_problem} It is retried every interval."
        return ok, problem

    def poll(self) -> None:
        args = copy.copy(self.prom_args)
        args.range = max(self.window_s, 60.0)
        args.end = None
        args.timeout = self.timeout
        try:
            col = collect_prometheus(args, self.adapter)
        except Exception as e:  # a bug must not stop the polling loop: shown on /fleet, retried next tick
            self.fleet_messages = [f"Reading {args.prometheus} failed unexpectedly ({type(e).__name__}: {e}); retrying."]
            self.pass_problem = self.fleet_messages[0]
            return
        self.pass_problem = str(col.fleet.get("pass_failed") or "")
        self.fleet_messages = [m for i in col.inputs for m in i.messages]
        self.capacity = summarize(loads(col.timelines)) if col.timelines else None
        seen = set()
        now = time.time()
        for tl in col.timelines:
            t = self.by_name.get(tl.target)
            if t is None:
                t = self.by_name[tl.target] = LiveTarget(tl.target, tl)
                self.targets.append(t)
            with t.lock:
                t.timeline = tl
                t.version = col.versions.get(tl.target, t.version)
            t.up, t.last_error, t.last_scrape_ts = True, "", now
            t.scrapes += 1
            seen.add(tl.target)
        why = self.fleet_messages[0] if self.fleet_messages and not col.timelines else "not in Prometheus during the last window"
        for name, t in self.by_name.items():
            if name not in seen:
                t.up, t.last_error = False, why
                t.scrape_errors += 1


def fleet_monitor(args: argparse.Namespace, adapter: Any, **kw: Any) -> FleetMonitor:
    prom = argparse.Namespace(prometheus=args.prometheus, selector=getattr(args, "selector", ""), range=None,
                              step=getattr(args, "step", None), rate_window=getattr(args, "rate_window", None), end=None,
                              timeout=args.timeout, bearer_token=getattr(args, "bearer_token", None),
                              basic_auth=getattr(args, "basic_auth", None), header=getattr(args, "header", []))
    return FleetMonitor(adapter, prom, **kw)
