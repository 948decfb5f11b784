"""The fleet query plan: one PromQL query per canonical signal for the whole fleet.

The metric → signal mapping is the adapter's own (``engines/sglang/metrics.py`` GAUGES, COUNTERS,
HISTOGRAMS, CONFIG_GAUGES), so a Prometheus-fed timeline has the same signal names as a direct scrape.
Every selector takes both spellings (``sglang:x`` as served, ``sglang_x`` after Prometheus 3 escaping or
the router's ``/engine_metrics``; docs/sglang.md#spelling) with ``{__name__=~"sglang[:_]x"}``. Counter rates are
computed by Prometheus (``rate()``); histogram quantiles from one bare bucket-rate answer per histogram
(:func:`bucket_rates`, :mod:`diagnoser.fleet.quantiles`), or by Prometheus (``histogram_quantile()``, the
quantile queries of :func:`plan`) when that answer cannot be used; gauges are
read as they are stored (no server-side aggregation: measured 2-3x cheaper for Prometheus than ``max by``)
and reduced per target and rank here with the same rule as the direct path (``max``, or ``sum`` over
``pid``/``endpoint`` series for the PID_SUMMED gauges; counters summed over label splits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnoser.engines.sglang import metrics as M

# labels that identify a target and a rank (docs/sglang.md#labels); everything else is reduced away
TARGET_LABELS = ("job", "instance", "model_name")
RANK_LABELS = ("dp_rank", "pp_rank", "tp_rank")
# `name` is the model label of the 2024 pre-release names (docs/sglang.md#prerelease-names)
GROUP = ", ".join(TARGET_LABELS + ("name",) + RANK_LABELS)
HIST_GROUP = ", ".join(("le",) + TARGET_LABELS + ("name",))

# gauges that name a target in discovery (any SGLang generation has one of them)
CORE_GAUGES = ("num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput", "num_requests_running")
CORE_SIGNALS = ("running_reqs", "queue_reqs", "token_usage", "gen_throughput_tps")

_SELECTOR_RE = re.compile(r"""^\s*\{?\s*(?P<body>.*?)\s*\}?\s*$""", re.S)
_MATCHER_RE = re.compile(r"""\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*(,|$)""")


def parse_selector(text: str | None) -> str:
    """``{job="sglang"}`` → ``job="sglang"`` (the matchers to add to every selector).

    Raises ValueError with one sentence for a selector that cannot be used."""
    if not text or not text.strip():
        return ""
    t = text.strip()
    if not t.startswith("{") and re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\s*\{", t):
        raise ValueError(f"--selector {t!r} names a metric; pass only label matchers, e.g. '{{job=\"sglang\"}}'")
    m = _SELECTOR_RE.match(t)
    body = (m.group("body") if m else t).strip().rstrip(",")
    if "__name__" in body:
        raise ValueError("--selector must not match on __name__: diagnoser picks the SGLang metric names itself")
    pos = 0
    while pos < len(body):
        mm = _MATCHER_RE.match(body, pos)
        if not mm:
            raise ValueError(f"--selector {text!r} is not a PromQL label selector; use e.g. '{{job=\"sglang\",cluster=~\"eu-.*\"}}'")
        pos = mm.end()
    return body


def name_selector(names: list[str] | tuple[str, ...], matchers: str, suffix: str = "", extra: str = "") -> str:
    """``{__name__=~"sglang[:_](a|b)_bucket", priority="", job="x"}``: both spellings, one selector.

    ``priority=""`` keeps the totals and drops the per-priority split (0.5.10+, docs/sglang.md#labels), as the
    direct path does."""
    alt = names[0] if len(names) == 1 else "(" + "|".join(names) + ")"
    rx = f"sglang[:_]{alt}{suffix}"
    parts = [f'__name__=~"{rx}"', 'priority=""'] + ([extra] if extra else []) + ([matchers] if matchers else [])
    return "{" + ", ".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class SignalQuery:
    signal: str  # canonical signal written to the timeline
    kind: str  # gauge | rate | total | increase | quantile
    promql: str
    shown: str  # short form for evidence sources: sglang:num_queue_reqs, rate(sglang:…[1m]) …
    how: str = "max"  # how duplicate (target, rank) series combine
    per_rank: bool = True
    priority: int = 0  # several queries for one signal: the lowest priority that has data wins
    total: str = ""  # "delta" queries: also keep the running total under this signal
    base: str = ""  # "quantile" queries: the histogram's name (bucket_rates asks its rates once)
    q: float = 0.0  # "quantile" queries: the quantile


def _dur(seconds: float) -> str:
    s = max(1, int(round(seconds)))
    return f"{s}s"


def plan(matchers: str, step: float, rate_window: float) -> list[SignalQuery]:
    """Every range query for one evaluation pass (one per signal, whole fleet)."""
    out: list[SignalQuery] = []
    by_signal: dict[str, list[str]] = {}
    for name, sig in M.GAUGES.items():
        by_signal.setdefault(sig, []).append(name)
    for sig, names in by_signal.items():
        summed = all(n in M.PID_SUMMED for n in names)
        agg = "sum" if summed else "max"
        extra = 'endpoint!="/metrics"' if "http_requests_active" in names else ""  # not the scraper's own request
        # the retraction counter (0.5.7+) beats the per-report gauge, which a scrape can miss
        out.append(SignalQuery(sig, "gauge", name_selector(names, matchers, extra=extra),
                               f"sglang:{names[0]}", agg, priority=2 if sig == "retracted_reqs" else 0))
    w = _dur(rate_window)
    rates: dict[str, list[str]] = {}
    totals: dict[str, list[str]] = {}
    for cname, (rate_sig, total_sig) in M.COUNTERS.items():
        if rate_sig:
            rates.setdefault(rate_sig, []).append(cname)
        if total_sig:
            totals.setdefault(total_sig, []).append(cname)
    for sig, names in rates.items():
        out.append(SignalQuery(sig, "rate", f"rate({name_selector(names, matchers)}[{w}])",
                               f"rate(sglang:{names[0]}[{w}])", "sum"))
    for sig, names in totals.items():
        if sig == "retractions_total":
            continue  # below, with the per-step counts
        out.append(SignalQuery(sig, "total", name_selector(names, matchers), f"sglang:{names[0]}", "sum"))
    # the API's answers by status (0.5.7+): POST only, as the direct path reads them (metrics.py; not
    # health checks or scrapes), summed over endpoints and codes per target: request_outcomes' counters
    for sig, extra in (("http_responses_total", 'method="POST"'), ("http_errors_total", 'method="POST", status_code=~"[45].*"'),
                       ("http_400_total", 'method="POST", status_code="400"'), ("http_429_total", 'method="POST", status_code="429"'),
                       ("http_503_total", 'method="POST", status_code="503"')):
        out.append(SignalQuery(sig, "total", name_selector(["http_responses_total"], matchers, extra=extra),
                               f"sglang:http_responses_total{{{extra}}}", "sum", per_rank=False))
    # Per-step counts come from the counter's value at each step, differenced here (a drop is a
    # restart: count from 0), as the direct path does between scrapes; increase() over one step would
    # need two scrapes inside every step. Retractions: the 0.5.7+ counter, else the 0.4.10-0.5.2
    # cumulative gauge (docs/sglang.md#metrics-queue).
    for prio, name in enumerate(("num_retracted_requests_total", "total_retracted_reqs")):
        out.append(SignalQuery("retracted_reqs", "delta", name_selector([name], matchers),
                               f"sglang:{name}", "sum", priority=prio, total="retractions_total"))
    # tokens decoded per step, counted as they are generated (0.5.7+; the direct path's decode_tokens)
    out.append(SignalQuery("decode_tokens", "delta", name_selector(["realtime_tokens_total"], matchers, extra='mode="decode"'),
                           'sglang:realtime_tokens_total{mode="decode"}', "sum"))
    # forward passes per step (one prefill pass = one prefill batch), as the direct path counts them
    for kind in ("prefill", "decode"):
        out.append(SignalQuery(f"{kind}_passes", "delta", name_selector(["cuda_graph_passes_total"], matchers, extra=f'mode=~"{kind}_.*"'),
                               f'sglang:cuda_graph_passes_total{{mode=~"{kind}_.*"}}', "sum"))
    # prefill tokens per step by mode: the 0.5.18+ family first (it excludes retraction re-counts)
    for prio, fam in enumerate(("prefill_effective_tokens_total", "realtime_tokens_total")):
        out.append(SignalQuery(PREFILL, "prefill", name_selector([fam], matchers),
                               f"sglang:{fam}", "sum", priority=prio))
    stems: dict[str, list[str]] = {}
    for base, stem in M.HISTOGRAMS.items():
        stems.setdefault(stem, []).append(base)
    # quantiles: one point per rate window (non-overlapping, like the direct path's per-interval
    # quantiles) — the bucket series are the fleet's largest set, this keeps them cheap
    for stem, bases in stems.items():
        for q in M.HISTOGRAM_QUANTILES.get(stem, (0.5, 0.95)):
            for prio, base in enumerate(bases):  # one name per query: old and new names have different buckets
                sel = name_selector([base], matchers, "_bucket")
                out.append(SignalQuery(f"{stem}_p{int(q * 100)}", "quantile",
                                       f"histogram_quantile({q:g}, sum by ({HIST_GROUP}) (rate({sel}[{w}])))",
                                       f"histogram_quantile({q:g}, sglang:{base}[{w}])", "max", per_rank=False, priority=prio,
                                       base=base, q=q))
    return out


def bucket_rates(plan_: list[SignalQuery], matchers: str, rate_window: float) -> dict[str, tuple[SignalQuery, list[SignalQuery]]]:
    """``{histogram: (its bare bucket-rate query, the plan's quantile queries it answers)}``: one
    ``rate(NAME_bucket[w])`` per histogram, from whose answer :mod:`diagnoser.fleet.quantiles` computes
    every quantile of it as Prometheus would (its ``sum by`` and ``histogram_quantile`` done here)."""
    out: dict[str, tuple[SignalQuery, list[SignalQuery]]] = {}
    w = _dur(rate_window)
    for sq in plan_:
        if sq.kind != "quantile" or not sq.base:
            continue
        if sq.base not in out:
            sel = name_selector([sq.base], matchers, "_bucket")
            out[sq.base] = (SignalQuery(f"buckets:{sq.base}", "buckets", f"rate({sel}[{w}])", f"rate(sglang:{sq.base}_bucket[{w}])",
                                        base=sq.base), [])
        out[sq.base][1].append(sq)
    return out


PREFILL = "prefill_tokens"  # pseudo-signal: split into prefill_new_tokens / prefill_cached_tokens / cache_hit_rate


def discovery_match(matchers: str) -> str:
    """The ``series`` matcher: core gauges (targets, ranks, spelling) plus the version-hint names."""
    names = list(dict.fromkeys(list(CORE_GAUGES) + [n for n, _, _ in M.VERSION_HINTS]))
    return name_selector(names, matchers, "(_count)?")


def config_query(matchers: str) -> str:
    return name_selector(sorted(M.CONFIG_GAUGES), matchers)


def any_sglang(matchers: str) -> str:
    sel = "{" + ", ".join(['__name__=~"sglang[:_].+"'] + ([matchers] if matchers else [])) + "}"
    return f"count by (job) ({sel})"
