"""The rule helpers' fast (numpy) paths give the same answers as the plain-Python reference paths."""

from __future__ import annotations

import math
import random

from diagnoser.rules.base import RuleContext, fast_summary, tokens_per_request
from diagnoser.rules.columns import joint, pairs
from diagnoser.timeline import Timeline, summarize
from tests.rules.helpers import ADAPTER


def _tl(n: int, seed: int = 1, per_second: int = 2) -> Timeline:
    rnd = random.Random(seed)
    tl = Timeline(target="t")
    for i in range(n):
        ts = 1000.0 + i // per_second  # several readings per second, as log lines sharing a stamp
        if rnd.random() < 0.9:
            tl.add("a", ts, rnd.random() if rnd.random() > 0.02 else math.nan, f"server.log:{i + 1}")
        if rnd.random() < 0.8:
            tl.add("b", ts, float(rnd.randint(0, 9)), f"server.log:{i + 1}")
    return tl


def _slow_joint(tl: Timeline) -> list[tuple[float, float, float, str]]:
    sa, sb = tl.get("a"), tl.get("b")
    assert sa is not None and sb is not None
    by_line, by_time = {}, {}  # the same log line's reading first, else the last one at the same time
    for t, v, s in zip(sb.ts.tolist(), sb.values.tolist(), sb.sources.tolist(), strict=True):
        by_line[s] = v
        by_time[t] = v
    out = []
    for t, v, s in zip(sa.ts.tolist(), sa.values.tolist(), sa.sources.tolist(), strict=True):
        w = by_line[s] if s in by_line else by_time.get(t)
        if w is not None and v == v and w == w:
            out.append((t, v, w, s))
    return out


def test_numpy_join_matches_the_python_join() -> None:
    for n, per in ((10, 2), (500, 2), (5000, 2), (500, 1), (5000, 1)):
        tl = _tl(n, seed=n, per_second=per)
        ctx = RuleContext(tl, {}, ADAPTER)
        fast = joint(ctx, "a", "b")
        assert fast == _slow_joint(tl)
        p = pairs(RuleContext(tl, {}, ADAPTER), "a", "b")
        assert [(float(t), float(x), float(y), p.src(k)) for k, (t, x, y) in enumerate(zip(p.ts, p.a, p.b, strict=True))] == fast


def test_fast_summary_matches_summarize() -> None:
    rnd = random.Random(7)
    for n in (0, 5, 63, 64, 1000):
        vals = [rnd.random() * 100 if rnd.random() > 0.05 else math.nan for _ in range(n)]
        a, b = fast_summary(vals), summarize(vals)
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] is None and b[k] is None) or math.isclose(a[k], b[k], rel_tol=1e-12), k


def test_tokens_per_request_prefers_decode_seq_lens() -> None:
    tl = Timeline(target="t")
    for i in range(5):
        tl.add("running_reqs", float(i), 4.0, "s")
        tl.add("used_tokens", float(i), 4000.0, "s")  # includes prompts still in prefill
        tl.add("decode_sum_seq_lens", float(i), 2000.0, "s")
    assert tokens_per_request(RuleContext(tl, {}, ADAPTER)) == (500.0, "median of decode_sum_seq_lens / running_reqs")
    # with the prefill counters, the readings after which no prefill ran were last written by a decode
    # report: there used tokens are the log's #token (the others include the prompt being prefilled)
    tl = Timeline(target="t")
    for i, moved in enumerate((128.0, 0.0, 64.0, 0.0, 0.0)):
        tl.add("running_reqs", float(i), 4.0, "s")
        tl.add("used_tokens", float(i), 4000.0 if moved else 1800.0, "s")
        tl.add("decode_sum_seq_lens", float(i), 2400.0, "s")
        tl.add("prefill_new_tokens", float(i), moved, "s")
    tpr, how = tokens_per_request(RuleContext(tl, {}, ADAPTER))
    assert tpr == 450.0 and "no prefill since the previous one" in how


def test_np_quantile_is_numpy_percentile_to_the_last_bit() -> None:
    """The pass's quantile skips numpy's call overhead; numpy stays the reference."""
    import numpy as np

    from diagnoser.rules.base import np_quantile

    rnd = random.Random(3)
    for n in (1, 2, 3, 64, 65, 999, 2381):
        for _ in range(10):
            arr = np.array([rnd.choice((rnd.random() * 1e4, float(rnd.randint(0, 40)), 0.1)) for _ in range(n)])
            srt = np.sort(arr)
            for q in (0.5, 0.95, 0.9, 0.25, 0.99):
                assert np_quantile(srt, q) == float(np.percentile(arr, 100 * q)), (n, q)


def test_stats_argmax_sources_and_events_match_the_timeline() -> None:
    from diagnoser.model import LogEvent
    from diagnoser.rules.columns import argmax_source

    for n in (10, 3000):
        tl = _tl(n, seed=n)
        for i in range(0, n, 7):
            tl.add_event(LogEvent("retraction" if i % 2 else "oom", 1000.0 + i, i, f"server.log:{i}", {}))
        ctx = RuleContext(tl, {}, ADAPTER)
        for sig in ("a", "b"):
            s = tl.get(sig)
            assert s is not None
            ref = summarize(s.values)
            got = ctx.stats(sig)
            assert got.keys() == ref.keys() and all(math.isclose(got[k], ref[k], rel_tol=1e-12) for k in got)
            assert argmax_source(ctx, sig) == s.sources[s.argmax()]
            assert argmax_source(ctx, sig, at="min") == s.sources[s.argmin()]
        assert ctx.span() == tl.span()
        assert ctx.events_of("retraction") == tl.events_of("retraction")
        assert ctx.events_of("oom", "retraction") == tl.events_of("oom", "retraction")
        assert ctx.events_of("nothing") == [] and ctx.events_of("nothing", "oom") == tl.events_of("oom")
        for rank in ("dp1", "dp0", "dp10/pp1"):
            tl.add("a", 1000.0, 1.0, "server.log:1", rank)
        tl.add("b", 1000.0, 1.0, "server.log:1", "dp3")
        ctx = RuleContext(tl, {}, ADAPTER)
        for sig in ("a", "b", "c"):
            assert ctx.ranks(sig) == tl.ranks(sig)
        assert ctx.ranks("a") == ["dp0", "dp1", "dp10/pp1"]
    nan = Timeline(target="t")
    for i in range(3):
        nan.add("a", float(i), math.nan, f"s{i}")
    assert argmax_source(RuleContext(nan, {}, ADAPTER), "a") == nan.get("a").sources[nan.get("a").argmax()]  # type: ignore[union-attr]
