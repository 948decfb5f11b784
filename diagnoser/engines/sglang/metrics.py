"""SGLang ``/metrics`` expositions → canonical signals (docs/sglang.md#metrics-endpoint, docs/sglang.md#signals).

Handles both spellings (``sglang:x`` as served, ``sglang_x`` after a Prometheus or router hop), the
2024 pre-release names with a ``name`` label, and every label generation (``model_name``,
``engine_type``, ``tp_rank``, ``dp_rank``, ``pp_rank``, ``moe_ep_rank``, ``--extra-metric-labels``,
``priority``, extra ``pid`` series).

Two parsers feed one ingestion step (:func:`ingest_samples`):
- the reference path, prometheus_client's ``text_string_to_metric_families`` (:func:`samples_from_families`);
- a fast path (:func:`fast_samples`) that reads only the lines of the families mapped here with one
  compiled regex and skips HELP/TYPE and unmapped families. Tests check both give identical signals on
  every real exposition; ``bench/bench_tick.py`` measures the fast path against the bare library parse.

Per-DP-rank series stay apart (rank key ``dp0``…); the timeline aggregates them with each signal's rule
(sum running/queued requests, never sum a ratio). Counters become per-interval rates that survive a
reset; histograms become per-interval quantiles, and :func:`window_quantile` gives the whole window's.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from diagnoser.engines.sglang.metric_names import (
    CATALOGUE_ONLY,
    CONFIG_GAUGES,
    COUNTERS,
    GAUGES,
    HISTOGRAM_QUANTILES,
    HISTOGRAMS,
    LABEL_HINTS,
    PID_SUMMED,
    PRERELEASE_NAMES,
    SCHEDULER_PROBE,
    TTFT_BUCKETS,
    VERSION_HINTS,
    WANTED,
    detect_version,
    version_from_labels,
)
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.floor import Floor
from diagnoser.model import SignalSink

__all__ = [  # the name tables live in metric_names; re-exported for the other readers (fleet, tests)
    "CONFIG_GAUGES", "COUNTERS", "GAUGES", "HISTOGRAM_QUANTILES", "HISTOGRAMS", "LABEL_HINTS", "PID_SUMMED",
    "PREFILL_MODES", "PRERELEASE_NAMES", "SCHEDULER_PROBE", "TTFT_BUCKETS", "VERSION_HINTS", "WANTED",
    "MetricsState", "Sample", "detect_version", "fast_samples", "fast_samples_regex", "has_sglang_family", "histogram_quantile", "quantile_bucket",
    "foreign_exposition", "ingest_families", "ingest_samples", "ingest_text", "normalise", "rank_key", "samples_from_families",
    "version_from_labels", "window_quantile", "window_quantiles",
]

_INF = math.inf
Sample = tuple[str, dict[str, str], float]  # (name without the sglang prefix, labels, value)

@functools.cache
def _fast_re() -> re.Pattern[str]:
    """The grammar of a wanted sample line (compiled on first use: log-only runs never pay for it).
    :func:`fast_samples` reads each new label text with it; :func:`fast_samples_regex` runs it over the
    whole text (the first fast path, kept as a reference in the tests)."""
    names = "|".join(sorted((re.escape(n) for n in WANTED), key=len, reverse=True))
    return re.compile(
        r'^sglang[:_](' + names + r')(?:\{((?:[^}"]|"(?:[^"\\\n]|\\.)*")*)\})?[ \t]+([^ \t\n]+)',
        re.MULTILINE,
    )


def _trie(words: Iterable[str]) -> str:
    """A regex alternation of ``words`` factored by common prefixes (the regex engine tries the branches
    of an alternation one by one; a trie tries one character per level)."""
    root: dict[str, Any] = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if "" in node and alts:
            alts.append("")
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")" if alts else ""

    return emit(root)


@functools.cache
def _scan_re() -> re.Pattern[str]:
    """Finds the wanted lines after a newline: a literal prefix (searched in C), the wanted names as a
    trie, then loosely the label text (to the brace before the value) and the value."""
    return re.compile(r"\nsglang[:_](" + _trie(WANTED) + r")(?:\{([^\n]*)\})?[ \t]+([^ \t\n]+)")


_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_UNESCAPE_RE = re.compile(r"\\(.)")
# label text (between the braces) → label dict, for the label texts of wanted lines that the full grammar
# has read. A server repeats the same label sets every scrape, so the grammar runs once per series, not
# once per scrape. The dicts are shared between scrapes and targets (read-only); the cache is cleared
# when it reaches the cap.
_LABEL_CACHE: dict[str, dict[str, str]] = {}
LABEL_CACHE_MAX = 50_000


def _unescape(v: str) -> str:
    return _UNESCAPE_RE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def _labels(lab: str) -> dict[str, str]:
    return {k: (_unescape(v) if "\\" in v else v) for k, v in _LABEL_RE.findall(lab)}


def normalise(name: str) -> str | None:
    """``sglang:x`` / ``sglang_x`` → ``x``; ``None`` for series that are not SGLang's."""
    if name.startswith("sglang:") or name.startswith("sglang_"):
        return name[7:]
    return None


def _grammar_line(line: str, out: list[Sample]) -> None:
    """Read one line with the full grammar; cache its label text when the grammar read it whole."""
    m = _fast_re().match(line)
    if m is None:
        return
    name, lab, val = m.groups()
    if lab:
        labels = _labels(lab)
        if len(_LABEL_CACHE) >= LABEL_CACHE_MAX:
            _LABEL_CACHE.clear()
        _LABEL_CACHE[lab] = labels
    else:
        labels = {}
    try:
        out.append((name, labels, float(val)))
    except ValueError:
        pass


def fast_samples(text: str, limit: int | None = None) -> list[Sample]:
    """The wanted samples of an exposition (no HELP/TYPE, no unmapped family), equal to the full line
    grammar (:func:`_fast_re`) sample for sample.

    One regex (:func:`_scan_re`) finds the wanted lines; a line whose label text the grammar has read
    before (it sits in the cache) needs nothing more: a valid label text has no unquoted brace, so the
    grammar would end it at the same brace and read the same value. Any other line (a new series, an odd
    line) is read with the grammar itself. Label dicts are shared between scrapes: do not mutate them.
    ``limit``: stop after about that many samples (a target sending 300k series costs no more)."""
    out: list[Sample] = []
    append = out.append
    get = _LABEL_CACHE.get
    if text.startswith("sglang"):  # the first line has no newline before it
        _grammar_line(text.split("\n", 1)[0], out)
    for m in _scan_re().finditer(text):
        if limit is not None and len(out) >= limit:
            break
        name, lab, val = m.groups()
        if lab is None:
            labels: dict[str, str] | None = {}
        else:
            labels = get(lab)
            if labels is None:
                end = text.find("\n", m.end())
                _grammar_line(text[m.start() + 1:end if end != -1 else len(text)], out)
                continue
        try:
            append((name, labels, float(val)))
        except ValueError:
            pass
    return out


def fast_samples_regex(text: str) -> list[Sample]:
    """The first fast path: the line grammar over the whole text (a reference for :func:`fast_samples`)."""
    out: list[Sample] = []
    for m in _fast_re().finditer(text):
        name, lab, val = m.groups()
        try:
            value = float(val)
        except ValueError:
            continue
        out.append((name, _labels(lab) if lab else {}, value))
    return out


def samples_from_families(families: Iterable[Any]) -> list[Sample]:
    """The same samples as :func:`fast_samples`, from prometheus_client metric families (reference path)."""
    out: list[Sample] = []
    for fam in families:
        if normalise(fam.name) is None:
            continue
        for s in fam.samples:
            name = normalise(s.name)
            if name in WANTED:
                out.append((name, dict(s.labels), _float(s.value)))
    return out


def _float(v: Any) -> float:
    """A sample value as a float: prometheus_client reads "999…9" as an int, which may not fit a float."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def has_sglang_family(families: Iterable[Any]) -> bool:
    return any(normalise(f.name) is not None for f in families)


looks_like_sglang = has_sglang_family  # older name

# exposition prefixes of servers people point diagnoser at by mistake → what to say
FOREIGN = (
    (("sgl_router_", "smg_"), "the SGLang router / model gateway, not a worker: pass each SGLang worker's URL (the router's /engine_metrics is not read)"),
    (("vllm:", "vllm_"), "a vLLM server: diagnoser reads SGLang only for now"),
    (("tgi_",), "a Text Generation Inference server: diagnoser reads SGLang only"),
    (("node_",), "a Prometheus node exporter: pass the SGLang server's URL (default port 30000)"),
    (("prometheus_", "go_gc_"), "a Prometheus or Go service: pass the SGLang server's URL (default port 30000)"),
)


def foreign_exposition(families: Iterable[Any]) -> str | None:
    """What the exposition looks like when it is not SGLang's (for the one-sentence error)."""
    names = [f.name for f in families]
    for prefixes, what in FOREIGN:
        if any(n.startswith(prefixes) for n in names):
            return what
    return None


def rank_key(labels: dict[str, str]) -> str:
    """Rank key for per-rank series: ``dp1``, ``pp1``, ``dp0/pp1`` or ``""`` for a single scheduler."""
    dp = labels.get("dp_rank")
    pp = labels.get("pp_rank")
    if not dp and (not pp or pp == "0"):
        return ""
    parts = []
    if dp:
        parts.append(f"dp{dp}")
    if pp and pp != "0":
        parts.append(f"pp{pp}")
    return "/".join(parts)


def _tp(labels: dict[str, str]) -> int:
    try:
        return int(labels.get("tp_rank") or 0)
    except ValueError:
        return 0


@dataclass(slots=True)
class _HistState:
    buckets: dict[float, float]
    count: float


@dataclass(slots=True)
class MetricsState:
    """What one target's scrapes remember between ticks: counters, histogram buckets, version evidence."""

    counters: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # key → (ts, value)
    hists: dict[tuple[str, str], tuple[float, _HistState]] = field(default_factory=dict)
    first_hists: dict[tuple[str, str], _HistState] = field(default_factory=dict)
    resets: int = 0
    version: VersionRange = field(default_factory=VersionRange)
    seen_names: set[str] = field(default_factory=set)
    other: dict[str, float] = field(default_factory=dict)  # catalogue metrics no signal maps: the last scrape's sum
    model_names: set[str] = field(default_factory=set)
    label_names: set[str] = field(default_factory=set)
    ttft_bounds: tuple[float, ...] | None = None  # finite TTFT bucket bounds, for version evidence
    sched_labels: set[str] | None = None  # label names on a scheduler gauge
    engine_types: set[str] = field(default_factory=set)
    prerelease: bool = False
    last_ts: float | None = None  # time of the previous scrape (a counter that appears later starts at 0)
    idle_ts: float | None = None  # the last scrape with nothing running or waiting: no latency observed later can be longer than since
    dropped: int = 0  # samples with impossible values (NaN, ±Inf, negative, bad le): counted, not used
    drop_examples: list[str] = field(default_factory=list)
    ranks: set[str] = field(default_factory=set)  # rank keys seen (at most MAX_RANKS)
    cut_series: int = 0  # samples of ranks past MAX_RANKS: counted, not used


# what one target can make us hold: at most this many DP/PP rank keys (each is a set of signals in the
# timeline; SGLang runs at most a few dozen), and this many distinct model names, label names, engine types
MAX_RANKS = 256
MAX_NAMES = 64
MAX_BUCKETS = 256  # distinct bucket bounds per histogram (SGLang's have at most a few dozen)


def _rank_ok(state: MetricsState, rk: str) -> bool:
    if rk in state.ranks:
        return True
    if len(state.ranks) >= MAX_RANKS:
        state.cut_series += 1
        return False
    state.ranks.add(rk)
    return True


def histogram_quantile(q: float, buckets: list[tuple[float, float]], at_most: float | None = None) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative (upper bound, count) pairs sorted by bound.

    ``at_most`` is the longest value any observation can have (the time elapsed since the server was last
    seen idle): an interpolation beyond it claims more than the buckets and the clock allow, so the
    bucket's lower bound is returned instead (the quantile is "more than" it; :func:`quantile_bucket`)."""
    lo, hi, v = quantile_bucket(q, buckets)
    if at_most is not None and not math.isnan(v) and v > at_most and hi > at_most:
        return lo
    return v


def quantile_bucket(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(lower bound, upper bound, interpolated value) of the bucket the q-quantile falls in; NaNs when empty."""
    if not buckets:
        return math.nan, math.nan, math.nan
    total = buckets[-1][1]
    if total <= 0:
        return math.nan, math.nan, math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound, bound, prev_bound
            if count == prev_count:
                return prev_bound, bound, bound
            return prev_bound, bound, prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound, math.inf, prev_bound


def _bounded(q: float, diff: list[tuple[float, float]], elapsed: float | None) -> tuple[float, str]:
    """The quantile and what to add to its source: when the interpolation passes the time elapsed since the
    server was last seen idle, the bucket's lower bound and "more than N s (the lo-hi s bucket …)"."""
    lo, hi, v = quantile_bucket(q, diff)
    if elapsed is not None and not math.isnan(v) and v > elapsed and hi > elapsed:
        return lo, f" (> {lo:g} s: in the {lo:g}-{hi:g} s bucket, and only {elapsed:.0f} s passed since the server was last idle)"
    if math.isinf(hi) and not math.isnan(v):
        return lo, f" (> {lo:g} s: the last finite bucket)"
    return v, ""


def ingest_families(families: Any, ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    """Reference path: prometheus_client families → signals. Returns the samples used."""
    return ingest_samples(samples_from_families(families), ts, sink, state, source)


def ingest_text(text: str, ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    """Fast path: exposition text → signals. Returns the samples used."""
    return ingest_samples(fast_samples(text), ts, sink, state, source)


def ingest_samples(samples: list[Sample], ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    """Turn one scrape's samples into signals, config facts and version evidence."""
    used = 0
    # (signal, rank) → {tp_rank: value}: with --enable-metrics-for-all-schedulers every TP rank exports
    # the same numbers; only the lowest TP rank of each DP rank (the stats-logging rank) counts.
    gauges: dict[tuple[str, str], dict[int, float]] = {}
    gauge_base: dict[str, str] = {}
    counters: dict[tuple[str, str], dict[int, float]] = {}
    hist: dict[str, dict[float, float]] = {}
    http: dict[str, float] = {}  # status code → POST responses since start
    seen = state.seen_names
    if not state.prerelease:  # decided before the loop: it changes how some gauges read
        state.prerelease = any(s[0] in PRERELEASE_NAMES for s in samples)
    other: dict[str, float] = {}
    state.other = other
    for name, labels, value in samples:
        seen.add(name)
        if name in CATALOGUE_ONLY:  # a metric of SGLang's that no signal needs (yet): its last value, summed over series
            if value == value:
                other[name] = other.get(name, 0.0) + value
            continue
        if labels:
            if len(state.label_names) < MAX_NAMES:
                state.label_names.update(labels)
            if labels.get("priority"):  # per-priority split of a total that is also exported
                continue
            mn = labels.get("model_name") or (labels.get("name") if name in PRERELEASE_NAMES or state.prerelease else None)
            if mn and len(state.model_names) < MAX_NAMES:
                state.model_names.add(mn)
            et = labels.get("engine_type")
            if et and len(state.engine_types) < MAX_NAMES:
                state.engine_types.add(et)
        if not (0.0 <= value < _INF) and name not in HINT_ONLY:  # NaN, ±Inf or negative: impossible here
            _drop(state, name, labels, value, "NaN" if value != value else "infinite" if math.isinf(value) else "negative")
            continue
        if name.endswith("_bucket"):
            stem = HISTOGRAMS.get(name[:-7])
            le = labels.get("le")
            if stem is None or le is None:
                continue
            bound = _bound(le)
            if bound is None:
                _drop(state, name, labels, value, "le is not a number")
                continue
            b = hist.setdefault(stem, {})  # tokenizer histograms are per server; sum label splits
            if bound not in b and len(b) >= MAX_BUCKETS:
                state.cut_series += 1
                continue
            b[bound] = b.get(bound, 0.0) + value
            used += 1
            continue
        if name == "http_responses_total":  # the API's answers by status (POST only: not health checks or our scrapes)
            if labels.get("method") == "POST":
                code = labels.get("status_code", "")
                http[code] = http.get(code, 0.0) + value
            used += 1
            continue
        if name in COUNTERS or name == "total_retracted_reqs":
            key = name
            if name in ("realtime_tokens_total", "prefill_effective_tokens_total", "cuda_graph_passes_total"):
                key = f"{name}:{labels.get('mode', '')}"
            ck = (key, rank_key(labels))
            if not _rank_ok(state, ck[1]):
                continue
            per_tp = counters.setdefault(ck, {})
            tp = _tp(labels)
            per_tp[tp] = per_tp.get(tp, 0.0) + value
            used += 1
            continue
        if name == "cached_tokens_total":
            continue
        rk = rank_key(labels)
        if not _rank_ok(state, rk):
            continue
        if name in CONFIG_GAUGES and rk in ("", "dp0"):
            sink.set_config(CONFIG_GAUGES[name], _intish(value), f"{source} sglang:{name}")
        sig = GAUGES.get(name)
        if sig is None:
            continue
        if name == "http_requests_active" and labels.get("endpoint") == "/metrics":
            continue  # our own scrape
        if name in SCHEDULER_PROBE and state.sched_labels is None:
            state.sched_labels = set(labels)
        if state.prerelease and name == "cache_hit_rate" and value > 1:
            value /= 100.0  # the pre-release gauge was a percentage
        per_tp = gauges.setdefault((sig, rk), {})
        tp = _tp(labels)
        if tp in per_tp:
            per_tp[tp] = per_tp[tp] + value if name in PID_SUMMED else max(per_tp[tp], value)
        else:
            per_tp[tp] = value
        gauge_base[sig] = name
        used += 1
    # the counter's per-interval delta is exact; the gauge only holds the last event: use the gauge only
    # when the counter gives no delta this tick (first scrape, or a version without the counter)
    has_retract_counter = (state.last_ts is not None and state.last_ts < ts
                           and any(k[0] == "num_retracted_requests_total" for k in counters))
    has_prefill_counter = any(k[0].startswith("prefill_effective_tokens_total:") or k[0].startswith("realtime_tokens_total:") for k in counters)
    for (sig, rk), per_tp in gauges.items():
        if sig == "retracted_reqs" and has_retract_counter:
            continue
        if sig == "cache_hit_rate" and has_prefill_counter:
            sig = "cache_hit_rate_last_prefill"  # the windowed hits/all from the counters is the better one
        sink.add(sig, ts, per_tp[min(per_tp)], f"{source} sglang:{gauge_base.get(sig, 'cache_hit_rate')}", rk)
    _counter_rates({k: v[min(v)] for k, v in counters.items()}, ts, sink, state, source)
    if http:
        src = f"{source} sglang:http_responses_total{{method=POST}}"
        sink.add("http_responses_total", ts, sum(http.values()), src, "")
        sink.add("http_errors_total", ts, sum(v for c, v in http.items() if c[:1] in "45"), src, "")
        for code in ("400", "429", "503"):
            sink.add(f"http_{code}_total", ts, http.get(code, 0.0), src, "")
    ttft = hist.get("ttft_seconds")
    if ttft and state.ttft_bounds is None:
        state.ttft_bounds = tuple(sorted(b for b in ttft if not math.isinf(b)))
    _hist_quantiles(hist, ts, sink, state, source)
    run, queue = gauges.get(("running_reqs", "")), gauges.get(("queue_reqs", ""))
    if run is not None and queue is not None and max(run.values()) == 0 and max(queue.values()) == 0:
        state.idle_ts = ts  # after this interval's quantiles: theirs count from the previous idle moment
    detect_version(state)
    state.last_ts = ts
    return used


# samples read only because their name is version evidence: any value (they feed no signal)
HINT_ONLY = frozenset(h[0] for h in VERSION_HINTS) - set(GAUGES) - set(CONFIG_GAUGES) - set(COUNTERS) - {
    f"{h}_bucket" for h in HISTOGRAMS} - {"total_retracted_reqs"}
DROP_EXAMPLES = 1  # sample texts kept per scrape target to show what was dropped


def _bound(le: str) -> float | None:
    """A bucket's upper bound, or None when ``le`` is not a number (``le="abc"``, ``le=""``, NaN)."""
    try:
        b = float(le)
    except ValueError:
        return None
    return None if b != b else b


def _drop(state: MetricsState, name: str, labels: dict[str, str], value: float, why: str) -> None:
    """Count a sample no SGLang server can send (its value is impossible, or its ``le`` is not a number)."""
    state.dropped += 1
    if len(state.drop_examples) < DROP_EXAMPLES:
        le = f'{{le="{labels["le"][:20]}"}}' if "le" in labels else ""
        state.drop_examples.append(f"sglang:{name}{le} {value!r} ({why})")


def _intish(v: float) -> Any:
    return int(v) if not math.isnan(v) and not math.isinf(v) and float(v).is_integer() else v


def _delta(state: MetricsState, key: tuple[str, str], ts: float, value: float) -> tuple[float, float] | None:
    """(increase, seconds) since the previous scrape; a drop means the server restarted (count from 0)."""
    prev = state.counters.get(key)
    state.counters[key] = (ts, value)
    if prev is None:
        # a labelled counter is exported from its first increment on: one that appears while the target
        # was already being scraped counted from 0 in between
        if state.last_ts is None or state.last_ts >= ts:
            return None
        prev = (state.last_ts, 0.0)
    pts, pval = prev
    dt = ts - pts
    if dt <= 0:
        return None
    inc = value - pval
    if inc < 0:
        state.resets += 1
        inc = value
    return inc, dt


PREFILL_MODES = {
    "prefill_effective_tokens_total": ({"input"}, {"device_hit", "host_hit", "storage_hit"}),
    "realtime_tokens_total": ({"prefill_compute"}, {"prefill_cache"}),
}


def _counter_rates(counters: dict[tuple[str, str], float], ts: float, sink: SignalSink, state: MetricsState, source: str) -> None:
    prefill: dict[str, dict[str, dict[str, float]]] = {}  # family → rank → mode → increase
    for (key, rk), value in counters.items():
        # a labelled counter appears at its first increment: while the target was already scraped, it was 0
        appeared = (key, rk) not in state.counters and state.last_ts is not None and state.last_ts < ts
        d = _delta(state, (key, rk), ts, value)
        if ":" in key:
            fam, mode = key.split(":", 1)
            if d is not None:
                prefill.setdefault(fam, {}).setdefault(rk, {})[mode] = d[0]
            continue
        src = f"{source} sglang:{key}"
        if key == "total_retracted_reqs":  # 0.4.10–0.5.2 cumulative gauge
            sink.add("retractions_total", ts, value, src, rk)
            if d is not None:
                sink.add("retracted_reqs", ts, d[0], src, rk)
            continue
        rate_sig, total_sig = COUNTERS[key]
        if total_sig:
            if appeared and state.last_ts is not None:
                sink.add(total_sig, state.last_ts, 0.0, f"{src} (not exported yet: 0)", rk)
            sink.add(total_sig, ts, value, src, rk)
        if d is None:
            continue
        inc, dt = d
        if rate_sig:
            sink.add(rate_sig, ts, inc / dt, src, rk)
        if key == "num_retracted_requests_total":
            sink.add("retracted_reqs", ts, inc, src, rk)
    # forward passes in the interval (mode prefill_* / decode_*: with or without a graph): one prefill pass
    # is one prefill batch, as one Prefill batch line is
    for rk, modes in prefill.get("cuda_graph_passes_total", {}).items():
        src = f"{source} sglang:cuda_graph_passes_total"
        for kind in ("prefill", "decode"):
            if any(m.startswith(kind) for m in modes):
                sink.add(f"{kind}_passes", ts, sum(v for m, v in modes.items() if m.startswith(kind)), src, rk)
    # tokens decoded in the interval, counted as they are generated (not when the request finishes)
    for rk, modes in prefill.get("realtime_tokens_total", {}).items():
        if "decode" in modes:
            sink.add("decode_tokens", ts, modes["decode"], f"{source} sglang:realtime_tokens_total{{mode=decode}}", rk)
    # prefill tokens in the interval: prefer the 0.5.18+ family that excludes retraction re-counts
    fam = "prefill_effective_tokens_total" if "prefill_effective_tokens_total" in prefill else "realtime_tokens_total"
    new_modes, hit_modes = PREFILL_MODES[fam]
    for rk, modes in prefill.get(fam, {}).items():
        new = sum(v for m, v in modes.items() if m in new_modes)
        hit = sum(v for m, v in modes.items() if m in hit_modes)
        src = f"{source} sglang:{fam}"
        sink.add("prefill_new_tokens", ts, new, src, rk)
        sink.add("prefill_cached_tokens", ts, hit, src, rk)
        if new + hit > 0:
            sink.add("cache_hit_rate", ts, hit / (new + hit), f"{src} (hits/all over the interval)", rk)


def _hist_quantiles(hist: dict[str, dict[float, float]], ts: float, sink: SignalSink, state: MetricsState, source: str) -> None:
    for stem, buckets in hist.items():
        cur = _HistState(buckets, buckets.get(math.inf, max(buckets.values(), default=0.0)))
        key = (stem, "")
        prev = state.hists.get(key)
        if prev is None and state.last_ts is not None and state.last_ts < ts:
            prev = (state.last_ts, _HistState({}, 0.0))  # appeared while scraped: it was empty before
        state.first_hists.setdefault(key, prev[1] if prev else cur)
        state.hists[key] = (ts, cur)
        if prev is None:
            continue
        p = prev[1]
        if cur.count < p.count:  # reset
            state.resets += 1
            diff = sorted(cur.buckets.items())
        else:
            diff = sorted((b, c - p.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
        if not diff or diff[-1][1] <= 0:
            continue
        elapsed = ts - state.idle_ts if state.idle_ts is not None and state.idle_ts < ts else None
        for q in HISTOGRAM_QUANTILES.get(stem, (0.5, 0.95)):
            v, note = _bounded(q, diff, elapsed)
            if not math.isnan(v):
                sink.add(f"{stem}_p{int(q * 100)}", ts, v, f"{source} sglang:{stem} histogram{note}", "")


def window_quantile(state: MetricsState, stem: str, q: float, rank: str = "") -> float:
    """Quantile over the whole window: the last scrape's buckets minus the first one's."""
    first = state.first_hists.get((stem, rank))
    last = state.hists.get((stem, rank))
    if first is None or last is None or last[1] is first:
        return math.nan
    cur = last[1]
    if cur.count < first.count:
        diff = sorted(cur.buckets.items())
    else:
        diff = sorted((b, c - first.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
    elapsed = last[0] - state.idle_ts if state.idle_ts is not None and state.idle_ts < last[0] else None
    lo, hi, v = quantile_bucket(q, diff)
    if not math.isnan(v) and ((elapsed is not None and v > elapsed and hi > elapsed) or math.isinf(hi)):
        return Floor(lo, hi)  # "more than lo": what the buckets and the clock allow (outputs say "> lo")
    return v


def window_quantiles(state: MetricsState) -> dict[str, float]:
    """``{"ttft_seconds_p95": …}`` over the whole window, for every histogram seen at least twice."""
    out = {}
    for stem, _rank in state.hists:
        for q in HISTOGRAM_QUANTILES.get(stem, (0.5, 0.95)):
            v = window_quantile(state, stem, q)
            if not math.isnan(v):
                out[f"{stem}_p{int(q * 100)}"] = v
    return out
