"""The rule pass's fast paths against their references on the real cpu-real windows
(tests/data/sglang-cpu-real, every scrape plus the whole log, as ``bench/bench_rules.py`` reads them).

* :func:`aligned` / :func:`pairs` (shared time arrays, joins searched once per distinct time) against a
  plain dict join (the last reading at each time wins), on every pair of the signals the rules join.
"""

from __future__ import annotations

import glob
import math
import os
import re
from itertools import permutations
from typing import Any

import numpy as np
import pytest

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.rules.base import RuleContext
from diagnoser.rules.columns import _time_runs, aligned, pairs, raw_arrays
from diagnoser.sources.logs import read_log
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA

JOINED = ("running_reqs", "queue_reqs", "token_usage", "used_tokens", "gen_throughput_tps", "prefill_new_tokens",
          "prefill_cached_tokens", "pending_tokens", "cuda_graph", "prompt_tps", "decode_sum_seq_lens")


def _read(path: str) -> Timeline:
    tl = Timeline(target=os.path.basename(path))
    vr = VersionRange()
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    for f in sorted(glob.glob(os.path.join(path, "metrics", "*.prom"))):
        ts = float(re.search(r"_(\d+\.\d+)\.prom$", f).group(1))  # type: ignore[union-attr]
        with open(f) as fh:
            mt.ingest_text(fh.read(), ts, tl)
    vr.merge(mt.state.version)
    reader = read_log(ADAPTER, tl, os.path.join(path, "server.log"))
    vr.merge(reader.parser.version)
    finalize(tl, vr)
    return tl


@pytest.fixture(scope="module")
def windows() -> list[Timeline]:
    runs = sorted(glob.glob(os.path.join(DATA, "sglang-cpu-real", "*")))
    assert len(runs) == 5, runs
    return [_read(r) for r in runs]


def _ref_aligned(tl: Timeline, base: str, other: str) -> list[float]:
    """The same log line's reading first (a source naming a line: a ':' and no scrape '@'), else the last
    one read at the same time."""
    last: dict[float, float] = {}
    line: dict[str, float] = {}
    sb = tl.get(other)
    assert sb is not None
    for t, v, src in zip(sb.ts.tolist(), sb.values.tolist(), sb.sources.tolist(), strict=True):
        last[t] = v
        if ":" in src and "@" not in src:
            line[src] = v
    sa = tl.get(base)
    assert sa is not None
    return [line[src] if src in line else last.get(t, math.nan) for t, src in zip(sa.ts.tolist(), sa.sources.tolist(), strict=True)]


def test_aligned_and_pairs_match_the_dict_join(windows: list[Timeline]) -> None:
    paths: dict[str, int] = {}
    for tl in windows:
        ctx = RuleContext(tl, {}, ADAPTER)
        present = [s for s in JOINED if tl.get(s) is not None]
        for a, b in permutations(present, 2):
            ref = _ref_aligned(tl, a, b)
            ta, va = raw_arrays(ctx, a)
            tb, _ = raw_arrays(ctx, b)
            kind = "same-times" if ta is tb else _time_runs(ctx, ta)[0]
            paths[kind] = paths.get(kind, 0) + 1
            got = aligned(ctx, a, b)
            assert np.array_equal(got, np.array(ref), equal_nan=True), (tl.target, a, b, kind)
            p = pairs(ctx, a, b)
            sa = tl.get(a)
            assert sa is not None
            want: list[Any] = [(t, v, w, src) for t, v, w, src in zip(sa.ts.tolist(), sa.values.tolist(), ref, sa.sources.tolist(), strict=True) if v == v and w == w]
            assert [(float(t), float(x), float(y), p.src(k)) for k, (t, x, y) in enumerate(zip(p.ts, p.a, p.b, strict=True))] == want
        assert ctx.span() == tl.span() and ctx.window_text() == f"{tl.span()[1] - tl.span()[0]:.0f} s"  # type: ignore[operator]
        assert tl.span() == _ref_span(tl)
    # the real windows exercise every path: series read on the same lines, log times repeating within a second
    assert paths.get("same-times", 0) >= 10 and paths.get("ordered", 0) >= 10, paths


def _ref_span(tl: Timeline) -> tuple[float | None, float | None]:
    """Timeline.span compared point by point, the reference for its built-in min/max version."""
    start = end = None
    for s in tl.series.values():
        if len(s):
            first, last = float(s.ts[0]), float(s.ts[-1])
            start = first if start is None else min(start, first)
            end = last if end is None else max(end, last)
    for e in tl.events:
        start = e.ts if start is None else min(start, e.ts)
        end = e.ts if end is None else max(end, e.ts)
    return start, end


def test_np_summary_is_numpy_on_every_real_series(windows: list[Timeline]) -> None:
    """The pass's summary (sum over n, sorted ends, quantiles on the sorted array) against numpy's
    mean/min/max/percentile, to the last bit, on every real series and its busy (> 0) part."""
    from diagnoser.rules.base import _np_summary

    n = 0
    for tl in windows:
        for s in tl.series.values():
            vals = np.fromiter(s.values, dtype=float, count=len(s))
            for arr in (vals, vals[vals > 0]):
                ok = arr[~np.isnan(arr)]
                got = _np_summary(arr)
                if not ok.size:
                    assert got["n"] == 0
                    continue
                want = {"last": float(ok[-1]), "mean": float(ok.mean()), "min": float(ok.min()), "max": float(ok.max()),
                        "p50": float(np.percentile(ok, 50)), "p95": float(np.percentile(ok, 95)), "n": int(ok.size)}
                assert got == want, (tl.target, s.sources[0])
                n += 1
    assert n > 200
    with_zero = np.array([0.0, -0.0, 3.0, math.nan] * 20)  # the sorted ends cannot tell 0.0 from -0.0
    assert math.copysign(1, _np_summary(with_zero)["min"]) == math.copysign(1, float(with_zero[~np.isnan(with_zero)].min()))


# -- prefill_decode_interference: the vectorised runs against the per-point loop they replaced ---------

def _ref_from_log(rule: Any, ctx: RuleContext) -> Any:
    """PF02's log path as it was written first: joint() tuples, each source's line parsed with a regex,
    the runs found by a loop over the batches in line order (the reference for the vectorised one)."""
    import bisect

    from diagnoser.rules.base import evidence
    from diagnoser.rules.columns import joint
    from diagnoser.rules.pf02_prefill_decode_interference import _line

    t = ctx.thresholds
    ps = ctx.series("prefill_new_tokens")
    if ps is None:
        return None
    _, pv = raw_arrays(ctx, "prefill_new_tokens")
    if not any(not ps.sources[i].startswith("scrape@") for i in (pv >= t["min_batch_tokens"]).nonzero()[0].tolist()):
        return None
    pre = [(_line(p[3]), p) for p in joint(ctx, "prefill_new_tokens", "prefill_running_reqs" if ctx.series("prefill_running_reqs") is not None else "running_reqs") if not p[3].startswith("scrape@")]
    pre = [x for x in pre if x[0] >= 0]
    if len(pre) < t["min_run"]:
        return None
    dec_s = ctx.series("gen_throughput_tps")
    dec_lines = sorted(n for n in (_line(s) for s in (dec_s.sources if dec_s else []) if not s.startswith("scrape@")) if n >= 0)
    best: list[Any] = []
    cur: list[Any] = []
    last_line = -1
    for line_no, p in sorted(pre, key=lambda x: x[0]):
        if cur:
            i = bisect.bisect_right(dec_lines, last_line)
            if i < len(dec_lines) and dec_lines[i] < line_no:
                cur = []
        if p[2] >= t["min_running"]:
            cur.append(p)
            last_line = line_no
        else:
            cur = []
        if len(cur) > len(best):
            best = list(cur)
    if len(best) < t["min_run"]:
        return None
    mean_tok = sum(p[1] for p in best) / len(best)
    if mean_tok < t["min_batch_tokens"]:
        return None
    total = sum(p[1] for p in best)
    rmin, rmax = min(p[2] for p in best), max(p[2] for p in best)
    evs = [evidence("consecutive prefill batches with no decode line between", len(best), t["min_run"], "", f"{best[0][3]} .. {_line(best[-1][3])}"),
           evidence("prefill_new_tokens per batch (mean)", round(mean_tok), t["min_batch_tokens"], "", best[0][3]),
           evidence("running_reqs during the run", f"{rmin:.0f}–{rmax:.0f}", f">= {t['min_running']}", "", best[-1][3])]
    summary = (f"{len(best)} prefill batches ran back to back ({total:,.0f} new tokens, {mean_tok:,.0f} per batch) with no decode step between them "
               f"while {rmin:.0f}–{rmax:.0f} requests were running and waiting for their next token.")
    return rule.finding(ctx, summary, evs, rule._suggestions(ctx, mean_tok), confidence="medium")


def _ref_metrics_running(ctx: RuleContext, pts: list[Any], min_running: float) -> list[bool]:
    """PF02's metrics path: the running count at each point through pairs(running_reqs, gen_throughput_tps)."""
    run = pairs(ctx, "running_reqs", "gen_throughput_tps")
    at = np.searchsorted(run.ts, np.fromiter((p[0] for p in pts), dtype=float, count=len(pts)), side="right") - 1
    return [(float(run.a[k]) if k >= 0 and run.ts[k] == p[0] else 0) >= min_running for k, p in zip(at.tolist(), pts, strict=True)]


def _ref_from_metrics(rule: Any, ctx: RuleContext) -> Any:
    """PF02's metrics path as written first: joint() tuples and the running count through pairs()."""
    from diagnoser.rules.base import evidence
    from diagnoser.rules.columns import joint
    from diagnoser.timeline import quantile

    t = ctx.thresholds
    pts = joint(ctx, "prompt_tps", "gen_throughput_tps")
    if len(pts) < t["min_scrapes"]:
        return None
    ok = _ref_metrics_running(ctx, pts, t["min_running"])
    pts = [p for p, keep in zip(pts, ok, strict=True) if keep]
    if len(pts) < t["min_scrapes"]:
        return None
    gens = sorted(p[2] for p in pts)
    prompts = sorted(p[1] for p in pts)
    med, p75 = quantile(gens, 0.5), quantile(prompts, 0.75)
    if med <= 0 or p75 <= 0:
        return None
    dips = [p for p in pts if p[1] >= p75 and p[2] < t["dip_ratio"] * med]
    peaks = [p for p in pts if p[1] >= p75]
    if len(dips) < 2 or len(dips) < 0.5 * len(peaks):
        return None
    evs = [evidence("gen_throughput_tps at prompt peaks", round(min(d[2] for d in dips), 1), f"< {t['dip_ratio']} x median {med:.0f}", ctx.window_text(), dips[0][3]),
           evidence("prompt_tps p75", round(p75, 1), None, ctx.window_text(), "")]
    summary = f"Generation throughput fell below {t['dip_ratio']:.0%} of its median ({med:.0f} tok/s) in {len(dips)} of {len(peaks)} scrapes where prompt throughput peaked, while requests were running."
    return rule.finding(ctx, summary, evs, rule._suggestions(ctx, None), confidence="low")


def test_pf02_metrics_path_matches_the_joint_version(windows: list[Timeline]) -> None:
    """The metrics path on pairs() (sources read for the evidence only) against joint() tuples, on the
    real windows and halves of them, under thresholds that make it fire."""
    from diagnoser.rules.pf02_prefill_decode_interference import PrefillDecodeInterference

    rule = PrefillDecodeInterference()
    fired = compared = 0
    for tl in windows:
        start, end = tl.span()
        for w in (tl, tl.window(start, (start + end) / 2), tl.window((start + end) / 2, None)):  # type: ignore[operator]
            for dip in (0.5, 0.9, 1.0, 1.5, 3.0):
                for min_running in (0, 1, 4):
                    for min_scrapes in (2, 6):
                        th = {**rule.defaults, "dip_ratio": dip, "min_running": min_running, "min_scrapes": min_scrapes}
                        got = rule._from_metrics(RuleContext(w, th, ADAPTER))
                        want = _ref_from_metrics(rule, RuleContext(w, th, ADAPTER))
                        assert (got and got.to_dict()) == (want and want.to_dict()), (w.target, th)
                        fired += want is not None
                        compared += 1
    assert compared >= 400 and fired >= 20, (compared, fired)


def _case_windows() -> list[Timeline]:
    out = []
    for log in sorted(glob.glob(os.path.join(DATA, "cases", "*", "server.log"))):
        tl = Timeline(target=os.path.basename(os.path.dirname(log)))
        vr = VersionRange()
        reader = read_log(ADAPTER, tl, log)
        vr.merge(reader.parser.version)
        finalize(tl, vr)
        out.append(tl)
    return out


def test_pf02_runs_match_the_loop_on_real_logs(windows: list[Timeline]) -> None:
    """On the cpu-real windows and every real case log, under thresholds that make the log path go all
    the way (small batches, no running floor, short runs), both give the same finding or none."""
    from diagnoser.rules.columns import joint
    from diagnoser.rules.pf02_prefill_decode_interference import PrefillDecodeInterference, running_at

    rule = PrefillDecodeInterference()
    fired = compared = 0
    for tl in windows + _case_windows():
        start, end = tl.span()
        parts = [tl] if start is None else [tl, tl.window(start, (start + end) / 2)]  # type: ignore[operator]
        for w in parts:
            for min_batch in (1, 128, 512, 8192):
                for min_running in (0, 1, 2, 4):
                    for min_run in (1, 2, 3, 5):
                        th = {**rule.defaults, "min_batch_tokens": min_batch, "min_running": min_running, "min_run": min_run}
                        got = rule._from_log(RuleContext(w, th, ADAPTER))
                        want = _ref_from_log(rule, RuleContext(w, th, ADAPTER))
                        assert (got and got.to_dict()) == (want and want.to_dict()), (w.target, th)
                        fired += want is not None
                        compared += 1
            ctx = RuleContext(w, dict(rule.defaults), ADAPTER)
            pts = joint(ctx, "prompt_tps", "gen_throughput_tps")
            if pts:
                for min_running in (0, 1, 2, 4, 8):
                    got_ok = [r >= min_running for r in running_at(ctx, [p[0] for p in pts])]
                    assert got_ok == _ref_metrics_running(ctx, pts, min_running), (w.target, min_running)
    assert compared > 500 and fired > 50, (compared, fired)



def test_pf01_stall_gap_check_changes_nothing(windows: list[Timeline]) -> None:
    """PF01's stall path skips its joins when no gap between admissions is stall_seconds long; with the
    check disabled (prefill times hidden from it) it gives the same answers on the real windows and case
    logs, under stall lengths that make it fire."""
    from diagnoser.rules import pf01_prefill_stall as pf01
    from tests.rules.helpers import window

    rule = pf01.PrefillStall()
    fired = pruned = compared = 0
    real = pf01.times_in_order
    # the real runs' queues are held by a limit the admission model names (the KV reservation, the slot
    # cap, the prefill budget), so none of them is a stall; two built windows with a queue nothing explains,
    # one without prefill batches (a stall) and one with a batch every second (the gap check prunes it)
    moving = [5, 4] * 20
    built = [window(step=1.0, queue_reqs=[10] * 40, token_usage=[0.3] * 40, running_reqs=moving, config={"max_running_requests": 64}),
             window(step=1.0, queue_reqs=[10] * 40, token_usage=[0.3] * 40, running_reqs=moving, prefill_new_tokens=[100] * 40,
                    config={"max_running_requests": 64})]
    for tl in windows + _case_windows() + built:
        for stall in (0.5, 2.0, 5.0, 10.0, 20.0, 60.0):
            for kv_room in (0.5, 0.9, 1.01):
                th = {**rule.defaults, "stall_seconds": stall, "kv_room": kv_room}
                calls: list[bool] = []
                pf01.times_in_order = lambda ctx, ts, _c=calls: _c.append(True) or real(ctx, ts)  # type: ignore[assignment,func-returns-value]
                try:
                    ctx = RuleContext(tl, th, ADAPTER)
                    got = rule._stall(ctx)
                    skipped = ("aligned", "queue_reqs", "token_usage", "") not in ctx.memo
                finally:
                    pf01.times_in_order = real  # type: ignore[assignment]
                pf01.times_in_order = lambda ctx, ts: False  # type: ignore[assignment]
                try:
                    want = rule._stall(RuleContext(tl, th, ADAPTER))
                finally:
                    pf01.times_in_order = real  # type: ignore[assignment]
                assert (got and got.to_dict()) == (want and want.to_dict()), (tl.target, th)
                fired += want is not None
                pruned += bool(calls) and skipped
                compared += 1
    assert fired >= 5 and pruned >= 5, (compared, fired, pruned)
