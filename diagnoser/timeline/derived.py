"""Signals derived the same way from every input: a log, direct scrapes, or Prometheus.

* :func:`decode_tokens_per_request`: KV tokens one running request holds, read at *decode* moments only.
  A ``Decode batch`` line prints ``#running-req`` and ``#token`` together; a log point is used only when
  both come from the same line. A scrape (or a Prometheus step) shows the gauges of SGLang's last report,
  and a prefill report rewrites the running count and the used tokens (which then include the prompt
  being prefilled) while ``decode_sum_seq_lens`` keeps the previous decode report's value
  (``python/sglang/srt/managers/scheduler_components/metrics_reporter.py`` at v0.5.23). So a scrape point
  counts only when no prefill batch ran since the previous reading (the prefill-token counters did not
  move): its last report was a decode report. Mixing the two moments made tokens per request up to 2x
  too high.
* :func:`window_rate`: a counter's rate over the whole window: the increases summed over the time they
  cover, not the mean of per-interval rates (an interval that happens to hold a burst of completions,
  or a short one, would weigh as much as a long quiet one). Tokens generated are counted as SGLang
  decodes them where it exports that (``sglang:realtime_tokens_total{mode="decode"}``, 0.5.7+) rather than
  when requests finish (``generation_tokens_total`` jumps by a whole non-streaming completion at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diagnoser.timeline import Series, Timeline


@dataclass(frozen=True, slots=True)
class Derived:
    value: float | None
    n: int = 0
    how: str = ""


def _median(vals: list[float]) -> float:
    s = sorted(vals)  # (no NaN: every ratio is of two positive readings)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _line_keys(s: Series) -> tuple[np.ndarray, np.ndarray]:
    """Per point: an int key for a log line (label id x 2^32 + line) and whether the point is from a log
    line (a source ``name:N`` that is not a scrape or a Prometheus step)."""
    labels, lab, line = s.sources.parts()
    logged = np.array([not (lb.startswith("scrape@") or lb.startswith("prometheus@")) for lb in labels], dtype=bool)
    is_log = logged[lab] & (line >= 0) if len(lab) else np.zeros(0, dtype=bool)
    return lab.astype(np.int64) * (1 << 32) + line.astype(np.int64), is_log


def _log_mask(s: Series) -> np.ndarray | None:
    """``_line_keys(s)[1]``, or None when no point is from a log line (every scrape and Prometheus step
    has no line number, so the labels are read only when some point has one)."""
    if not s.has_line_numbers():
        return None
    labels, lab, line = s.sources.parts()
    logged = np.array([not lb.startswith(("scrape@", "prometheus@")) for lb in labels], dtype=bool)
    mask = logged[lab] & (line >= 0)
    return mask if np.count_nonzero(mask) else None


def _no_prefill_at(tl: Timeline, ts: list[float], rank: str) -> list[bool] | None:
    """For scrape times: True where no prefill batch ran in the interval ending there (both prefill-token
    counters read 0 at that time); None when the input has no prefill counters."""
    new, hit = tl.get("prefill_new_tokens", rank), tl.get("prefill_cached_tokens", rank)
    if new is None:
        return None
    moved: dict[float, float] = {}
    for s in (new, hit):
        if s is None:
            continue
        is_log = _log_mask(s)
        at, vs = (s.ts, s.values) if is_log is None else (s.ts[~is_log], s.values[~is_log])
        for t, v in zip(at.tolist(), vs.tolist(), strict=True):
            if v == v:
                moved[t] = moved.get(t, 0.0) + v
    if not moved:
        return None
    return [moved.get(t, -1.0) == 0.0 for t in ts]


def decode_tokens_per_request(tl: Timeline, rank: str = "") -> Derived:
    """Median KV tokens per running request at decode moments (see the module doc); None when unknown.
    Plain lists: a window holds tens of readings, which Python walks as fast as numpy is called on them."""
    run = tl.get("running_reqs", rank)
    if run is None or not len(run):
        return Derived(None)
    rlog = _log_mask(run)
    rvals = run.values
    log_run: dict[int, float] = {}
    if rlog is None:
        scrape_run = dict(zip(run.ts.tolist(), rvals.tolist(), strict=True))  # (the last reading at a time)
    else:
        log_run = dict(zip(_line_keys(run)[0][rlog].tolist(), rvals[rlog].tolist(), strict=True))
        scrape_run = dict(zip(run.ts[~rlog].tolist(), rvals[~rlog].tolist(), strict=True))
    ratios: list[float] = []
    how: list[str] = []
    used = tl.get("used_tokens", rank)
    if used is not None and log_run:
        ukeys, ulog = _line_keys(used)
        for k, u in zip(ukeys[ulog].tolist(), used.values[ulog].tolist(), strict=True):
            r = log_run.get(k)
            if r and r > 0 and u > 0:
                ratios.append(u / r)
        if ratios:
            how.append("#token / #running-req of the Decode batch lines")
    if scrape_run:
        got = _scrape_ratios(tl, rank, scrape_run)
        if got:
            ratios.extend(got[0])
            how.append(got[1])
    if not ratios:
        return Derived(None)
    return Derived(_median(ratios), len(ratios), "median of " + " and ".join(how))


def _scrape_ratios(tl: Timeline, rank: str, scrape_run: dict[float, float]) -> tuple[list[float], str] | None:
    """Tokens / running at scrape (or Prometheus) times: used tokens at the readings with no prefill
    since the previous one (the log's #token at a decode report); when every reading saw a prefill (or
    the input has no prefill counters), decode_sum_seq_lens, which only a decode report writes."""
    cands: dict[str, tuple[list[float], list[bool] | None]] = {}
    get, nan = scrape_run.get, float("nan")
    for name in ("used_tokens", "decode_sum_seq_lens"):
        s = tl.get(name, rank)
        if s is None:
            continue
        slog = _log_mask(s)
        ts, vals = (s.ts, s.values) if slog is None else (s.ts[~slog], s.values[~slog])
        # (a time no running reading has, or a NaN, compares False)
        pts = [(t, v / r) for t, v in zip(ts.tolist(), vals.tolist(), strict=True) if (r := get(t, nan)) > 0 and v > 0]
        if pts:
            cands[name] = ([x for _t, x in pts], _no_prefill_at(tl, [t for t, _x in pts], rank))
    for name, label in (("used_tokens", "used tokens"), ("decode_sum_seq_lens", "decode_sum_seq_lens")):
        got = cands.get(name)
        if got is not None and got[1] is not None and any(got[1]):
            return ([x for x, quiet in zip(got[0], got[1], strict=True) if quiet],
                    f"{label} / running requests in the readings with no prefill since the previous one")
    # every reading saw a prefill: used tokens (the log's #token) overstate by the prompt being prefilled,
    # decode_sum_seq_lens by the requests that finished since the decode report that wrote it; with the
    # prefill counters at hand the first is the smaller error on the real runs (tests/data/sglang-cpu-real),
    # without them (no way to tell the moments apart) the gauge only a decode report writes
    counters = any(got[1] is not None for got in cands.values())
    for name in (("used_tokens", "decode_sum_seq_lens") if counters else ("decode_sum_seq_lens", "used_tokens")):
        got = cands.get(name)
        if got is not None:
            return got[0], f"{name} / running_reqs" + (" (every reading also saw a prefill report)" if counters else "")
    return None


def prefill_per_pass(tl: Timeline, rank: str = "") -> np.ndarray | None:
    """Per point of ``prefill_new_tokens``: the uncached tokens of one prefill batch. A log point is one
    ``Prefill batch`` line, so one batch; a scrape (or Prometheus step) point sums the interval's batches
    and is divided by the prefill forward passes counted in it (``sglang:cuda_graph_passes_total``
    ``mode=prefill_*``, 0.5.7+). NaN where the passes are unknown or zero; None without the signal."""
    s = tl.get("prefill_new_tokens", rank)
    if s is None:
        return None
    out = s.values.astype(float).copy()
    is_log = _log_mask(s)
    if is_log is not None and is_log.all():
        return out
    passes = tl.get("prefill_passes", rank)
    by_ts = {} if passes is None else dict(zip(passes.ts.tolist(), passes.values.tolist(), strict=True))
    for i in (range(len(out)) if is_log is None else (~is_log).nonzero()[0].tolist()):
        n = by_ts.get(float(s.ts[i]))
        out[i] = out[i] / n if n and n > 0 else np.nan
    return out


def _span_rate(s: Series) -> tuple[float, float] | None:
    """(sum of rate x interval, seconds) over a per-interval rate series; the first point's interval
    starts before the window and is left out (unless it is the only point). The reference of
    :func:`_span_rate_fast` (tests/test_derived.py compares them)."""
    ts, v = s.ts, s.values
    ok = ~np.isnan(v)
    ts, v = ts[ok], v[ok]
    if len(ts) == 0:
        return None
    if len(ts) == 1:
        return float(v[0]), 1.0
    dt = np.diff(ts)
    good = dt > 0
    if not good.any():
        return None
    return float((v[1:][good] * dt[good]).sum()), float(dt[good].sum())


def _span_rate_fast(s: Series) -> tuple[float, float] | None:
    """:func:`_span_rate` in fewer numpy calls for the usual series (no NaN value, times strictly
    increasing): the same products and sums of the same arrays, so the same numbers to the bit; any
    other series takes the reference path."""
    ts, v = s.ts, s.values
    if len(ts) >= 2:
        total = np.add.reduce(v)
        if total == total:  # no NaN (nor both infinities: those go the reference way)
            dt = np.subtract(ts[1:], ts[:-1])  # numpy.diff
            if np.minimum.reduce(dt) > 0:  # every interval counts (a NaN time compares False)
                return float(np.add.reduce(np.multiply(v[1:], dt))), float(np.add.reduce(dt))
    return _span_rate(s)


def _decoded_rate(dec: Series) -> Derived | None:
    """Tokens decoded per second over the window, from the realtime decode-token counter (None: too few readings)."""
    v = dec.values[~np.isnan(dec.values)]
    span = float(dec.ts[-1] - dec.ts[0])
    if span > 0 and len(v) >= 2:
        return Derived(float(v[1:].sum()) / span, len(v), "tokens decoded (sglang:realtime_tokens_total{mode=decode}) / window")
    return None


def _window_rate(s: Series) -> Derived:
    got = _span_rate_fast(s)
    if got is None:
        return Derived(None)
    total, secs = got
    return Derived(total / secs, len(s), "increase over the window / its length")


def window_rate(tl: Timeline, signal: str, rank: str = "", decoded: bool = True) -> Derived:
    """A rate over the window (see the module doc). ``output_tps`` prefers the decode-token counter,
    unless ``decoded`` is False (per finished request: the completions' own counter, as ``request_rate``).
    Computed once per state of the series it reads (:meth:`Series.memo`): the rules, the checks and the
    report ask for the same rates."""
    if signal == "output_tps" and decoded:
        dec = tl.get("decode_tokens", rank)
        if dec is not None and len(dec) >= 2:
            memo = dec.memo()
            got = memo.get("decoded_rate", memo)  # memo: not computed yet (None is a result: too few readings)
            if got is memo:
                got = memo["decoded_rate"] = _decoded_rate(dec)
            if got is not None:
                return got  # type: ignore[no-any-return]
    s = tl.get(signal, rank)
    if s is None or not len(s):
        return Derived(None)
    memo = s.memo()
    hit = memo.get("window_rate")
    if hit is None:
        hit = memo["window_rate"] = _window_rate(s)
    return hit  # type: ignore[no-any-return]


__all__ = ["Derived", "decode_tokens_per_request", "prefill_per_pass", "window_rate"]
