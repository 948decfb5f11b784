"""The fleet pass's fast paths agree with their reference paths (issue 26: a pass over 10,000 targets).

- ``_values_batch`` (every series of an answer converted at once) against ``_values`` per series, on plain
  and hostile answers: where the batch takes an answer, the arrays are the same and the reference would
  have dropped nothing; where it declines, the caller takes the reference path.
- ``_pick`` (series matched to targets, types checked once per answer) against ``_pick_reference``, and
  ``bound_quantiles`` skipping unchanged series against its loop.
- A whole pass over the 1,000 backfilled targets in a real Prometheus with every fast path on (the
  quantiles computed from one bucket-rate answer, diagnoser/fleet/quantiles.py) and off (each quantile
  asked of Prometheus): the same timelines, findings and report.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from diagnoser.fleet import bounds as B
from diagnoser.fleet import collect_prometheus
from diagnoser.fleet import source as S
from diagnoser.outputs.report import build
from tests.test_fleet_prometheus import big, ns  # noqa: F401  (the module fixture: 1,000 targets in a real Prometheus)


def _reference(lists: list[Any]) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    t = S._Targets()
    return [S._values(v, t) for v in lists], t.dropped


PLAIN = [[[1700000000 + 30 * j, f"{0.1 * j + i}"] for j in range(21)] for i in range(50)]
CASES: dict[str, list[Any]] = {
    "plain": PLAIN,
    "empty series among others": [PLAIN[0], [], PLAIN[1]],
    "one point each": [[[1.5, "2"]], [[3, "1e3"]], [[4, "-0"]]],
    "float and string times": [[[1700000000.5, "1"], ["1700000001", "2"]]],
    "NaN": [PLAIN[0], [[1, "NaN"], [2, "1"]]],
    "+Inf and 1e309": [[[1, "+Inf"], [2, "1e309"], [3, "-Inf"], [4, "2"]]],
    "junk value": [[[1, "abc"], [2, "1"]], PLAIN[0]],
    "short pair": [[[1], [2, "1"]]],
    "long pair": [[[1, "1", "x"], [2, "2", "y"]]],
    "a string as a pair": [["12", [3, "4"]]],
    "values not a list": [PLAIN[0], {"a": 1}, "1,2"],
    "None values": [None, PLAIN[0]],
    "out of order": [[[3, "1"], [1, "2"], [2, "3"]]],
    "order resets between series": [[[5, "1"], [6, "2"]], [[1, "1"], [2, "2"]]],
    "duplicate times": [[[1, "1"], [1, "2"], [2, "3"]]],
    "bool and null": [[[True, "1"], [2, None]]],
    "nested lists": [[[[1], "1"]]],
    "huge int time": [[[10**400, "1"], [2, "2"]]],
    "int times past 2**53": [[[2**53 + 1, "1"], [2**63 + 1, "2"]]],
    "mixed int and float times": [[[1, "1"], [2.5, "2"]], [[3.25, "3"], [4, "4"]]],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_values_equal_the_per_series_reference(case: str) -> None:
    lists = CASES[case]
    ref, dropped = _reference(lists)
    got = S._values_batch(lists)
    if got is None:  # declined: the caller takes the reference path, which counts what it drops
        return
    assert not dropped, f"the batch took an answer the reference drops from: {dropped}"
    assert len(got) == len(ref)
    for (gt, gv), (rt, rv) in zip(got, ref, strict=True):
        assert gt.dtype == rt.dtype == np.float64 and gv.dtype == rv.dtype == np.float64
        assert np.array_equal(gt, rt) and np.array_equal(gv, rv)


def test_batch_declines_what_the_reference_must_count() -> None:
    for case in ("NaN", "+Inf and 1e309", "junk value", "short pair", "values not a list", "out of order"):
        assert _reference(CASES[case])[1] or case in ("short pair", "out of order"), case
        assert S._values_batch(CASES[case]) is None, case
    assert S._values_batch(PLAIN) is not None and S._values_batch(CASES["order resets between series"]) is not None


def _targets() -> S._Targets:
    t = S._Targets()
    for key in (("sglang", "a:1", "m"), ("sglang", "b:1", "m"), ("sglang", "c:1", "x"), ("sglang", "c:1", "y"), ("other", "a:1", "m")):
        t.add(key)
    t.frozen = True
    return t


def _m(**labels: Any) -> dict[str, Any]:
    return {"job": "sglang", "model_name": "m", **labels}


V = [[1, "1"]]
PICKS: dict[str, list[Any]] = {
    "plain": [{"metric": _m(instance="a:1"), "values": V}, {"metric": _m(instance="b:1", tp_rank="1"), "values": V}],
    "the pre-release name label": [{"metric": {"job": "sglang", "instance": "a:1", "name": "m"}, "values": V}],
    "model-less, one model behind the instance": [{"metric": {"job": "sglang", "instance": "a:1"}, "values": V}],
    "model-less, two models behind it": [{"metric": {"job": "sglang", "instance": "c:1"}, "values": V}],
    "an unknown target (frozen)": [{"metric": _m(instance="z:1"), "values": V}, {"metric": _m(instance="a:1"), "values": V}],
    "another job": [{"metric": _m(job="other", instance="a:1"), "values": V}],
    "a target already done": [{"metric": _m(instance="b:1"), "values": V}],
    "no values key": [{"metric": _m(instance="a:1")}],
    "empty": [],
    "a result that is not a dict": [{"metric": _m(instance="a:1"), "values": V}, [1, 2], "x"],
    "no metric": [{"values": V}, {"metric": _m(instance="a:1"), "values": V}],
    "metric not a dict": [{"metric": ["a"], "values": V}],
    "a label that is not a string": [{"metric": _m(instance="a:1", tp_rank=1), "values": V}],
    "a null label": [{"metric": _m(instance=None), "values": V}, {"metric": _m(instance="a:1"), "values": V}],
    "empty model_name, name given": [{"metric": {"job": "sglang", "instance": "a:1", "model_name": "", "name": "m"}, "values": V}],
    "a str subclass label": [{"metric": _m(instance=type("S", (str,), {})("a:1")), "values": V}],
}


@pytest.mark.parametrize("case", sorted(PICKS))
def test_fast_pick_equals_the_reference(case: str) -> None:
    ta, tb = _targets(), _targets()
    done_a = {id(ta.keys[("sglang", "b:1", "m")])} if case == "a target already done" else set()
    done_b = {id(tb.keys[("sglang", "b:1", "m")])} if case == "a target already done" else set()
    ref = S._pick_reference(PICKS[case], ta, done_a)
    got = S._pick(PICKS[case], tb, done_b)
    assert sorted(tb.keys) == sorted(ta.keys)  # neither adds a target to a frozen fleet
    if got is None:  # declined: the caller takes the reference, which counts what it drops
        assert not tb.dropped
        return
    assert not ta.dropped, f"the fast pick took an answer the reference drops from: {ta.dropped}"
    names_a = {id(tl): k for k, tl in ta.keys.items()}
    names_b = {id(tl): k for k, tl in tb.keys.items()}
    assert [(m, names_b[id(tl)], v) for m, tl, v in got] == [(m, names_a[id(tl)], v) for m, tl, v in ref]


def test_fast_pick_declines_what_the_reference_drops() -> None:
    for case in ("a result that is not a dict", "no metric", "metric not a dict", "a label that is not a string", "a null label"):
        t = _targets()
        S._pick_reference(PICKS[case], t, set())
        assert t.dropped, case
        assert S._pick(PICKS[case], _targets(), set()) is None, case
    assert S._pick(PICKS["plain"], _targets(), set()) is not None


def _pass(url: str, end: float, batch: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, str]:
    monkeypatch.setattr(S, "_BATCH", batch)
    monkeypatch.setattr(B, "_FAST", batch)
    monkeypatch.setattr(S, "_LOCAL_QUANTILES", batch)  # off: every quantile asked of Prometheus, as before
    col = collect_prometheus(ns(url, selector='{job="sglang"}', range=600.0, step=None, rate_window=None, end=end), get_adapter())
    report = evaluate(col.timelines, get_adapter())
    doc = build(col, report)
    fleet = {k: v for k, v in doc["fleet"].items() if k != "source"}  # (the source part holds the pass's timings)
    rest = {k: v for k, v in doc.items() if k not in ("fleet", "inputs")}
    return col, report, json.dumps([rest, fleet], sort_keys=True, default=str)


def test_fast_and_reference_pass_agree_on_the_backfilled_fleet(big: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    prom, spec = big
    col_f, rep_f, doc_f = _pass(prom.url, spec.end, True, monkeypatch)
    col_r, rep_r, doc_r = _pass(prom.url, spec.end, False, monkeypatch)
    assert len(col_f.timelines) == len(col_r.timelines) == 1000
    # one bucket-rate query per histogram instead of one per quantile, none asked again (the way back)
    plan = S.Q.plan("", 30.0, 120.0)
    saved = sum(1 for q in plan if q.kind == "quantile") - len(S.Q.bucket_rates(plan, "", 120.0))
    assert saved > 0 and col_f.fleet["queries"] == col_r.fleet["queries"] - saved
    for a, b in zip(col_f.timelines, col_r.timelines, strict=True):
        assert a.target == b.target and sorted(a.series) == sorted(b.series)
        for key in a.series:
            sa, sb = a.series[key], b.series[key]
            assert np.array_equal(sa.ts, sb.ts) and np.array_equal(sa.values, sb.values, equal_nan=True)
            assert list(sa.sources) == list(sb.sources)
    assert [f.to_dict() for f in rep_f.findings] == [f.to_dict() for f in rep_r.findings]
    assert len(rep_f.findings) > 0
    assert doc_f == doc_r
    assert col_f.fleet["dropped"] == col_r.fleet["dropped"]


def _bounded_timeline(seed: int) -> Any:
    """A target's quantile series with idle steps, values in every bucket, past the clock, in the +Inf bucket,
    NaN, and a series whose points name two histograms (seeded)."""
    from diagnoser.timeline import Timeline

    rng = np.random.default_rng(seed)
    n = 40
    ts = 1_700_000_000.0 + 15.0 * np.arange(n)
    tl = Timeline(target="t")
    busy = rng.random(n) < 0.7
    tl.add_many("running_reqs", ts, np.where(busy, 3.0, 0.0), ["r"] * n)
    tl.add_many("queue_reqs", ts, np.where(busy & (rng.random(n) < 0.5), 1.0, 0.0), ["q"] * n)
    for name, base in (("ttft_seconds_p50", "time_to_first_token_seconds"), ("ttft_seconds_p95", "time_to_first_token_seconds"),
                       ("e2e_seconds_p95", "e2e_request_latency_seconds"), ("itl_seconds_p95", "inter_token_latency_seconds"),
                       ("queue_time_seconds_p95", "queue_time_seconds")):
        vals = rng.choice([0.05, 0.3, 1.0, 7.5, 45.0, 100.0, 400.0, 1000.0, float("nan")], n) * rng.uniform(0.8, 1.2, n)
        other = "inter_token_latency_seconds" if seed % 3 == 0 and name == "e2e_seconds_p95" else base
        srcs = [f"prometheus@x histogram_quantile(0.95, sglang:{base if j % 4 else other}[60s])" for j in range(n)]
        tl.add_many(name, ts, vals, srcs)
    # series no point of which changes: below every bucket, and no bucket known
    tl.add_many("ttft_seconds_p99", ts, rng.uniform(0.01, 0.09, n), ["prometheus@x histogram_quantile(0.99, sglang:time_to_first_token_seconds[60s])"] * n)
    tl.add_many("itl_seconds_p50", ts, rng.uniform(1, 900, n), ["prometheus@x histogram_quantile(0.5, sglang:time_per_output_token_seconds[60s])"] * n)
    return tl


@pytest.mark.parametrize("seed", range(12))
def test_fast_quantile_bounds_equal_the_reference(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from diagnoser.engines.sglang.versions import VersionRange

    buckets = {"time_to_first_token_seconds": (0.1, 0.5, 1.0, 5.0, 10.0, 60.0), "e2e_request_latency_seconds": (1.0, 10.0, 100.0),
               "queue_time_seconds": (0.5, 5.0, 50.0)} if seed % 2 else {}
    vr = VersionRange() if seed % 4 < 2 else None
    out = []
    skipped = []
    real_unchanged = B._unchanged
    monkeypatch.setattr(B, "_unchanged", lambda *a: skipped.append(real_unchanged(*a)) or skipped[-1])
    for fast in (True, False):
        monkeypatch.setattr(B, "_FAST", fast)
        tl = _bounded_timeline(seed)
        n = B.bound_quantiles(tl, vr, buckets)
        out.append((n, {k: (s.ts.tolist(), s.values.tolist(), s.sources.tolist()) for k, s in tl.series.items()}))
    assert out[0][0] > 0 and True in skipped and False in skipped  # some series change, some are skipped
    assert repr(out[0]) == repr(out[1])  # (repr: NaN equal to NaN)


def test_the_fleet_judged_over_workers_is_judged_as_in_one_process(big: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The 1,000 backfilled targets, their target rules split over two worker processes (diagnoser/forkmap.py,
    the default above 500 targets with two CPUs) and in one: the same findings, checks and report."""
    from diagnoser import forkmap

    prom, spec = big
    col = collect_prometheus(ns(prom.url, selector='{job="sglang"}', range=600.0, step=None, rate_window=None, end=spec.end), get_adapter())
    assert len(col.timelines) == 1000
    monkeypatch.setattr(forkmap, "stats", forkmap.Stats())
    split = evaluate(col.timelines, get_adapter(), workers=2)
    assert forkmap.stats.forked == 1 and forkmap.stats.fell_back == 0
    one = evaluate(col.timelines, get_adapter(), workers=1)
    assert [f.to_dict() for f in split.findings] == [f.to_dict() for f in one.findings] and len(one.findings) > 1000
    assert split.checked == one.checked and split.dropped == one.dropped and split.errors == one.errors
    assert json.dumps(build(col, split), sort_keys=True, default=str) == json.dumps(build(col, one), sort_keys=True, default=str)
