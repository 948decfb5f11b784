"""Histogram quantiles never claim more than the buckets and the clock allow (issue 25, item 6)."""

from __future__ import annotations

from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.metrics import histogram_quantile, quantile_bucket
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline

BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 400)


def _expo(run: int, queue: int, counts: dict[float, int]) -> str:
    lines = [f'sglang:num_running_reqs{{model_name="m"}} {run}', f'sglang:num_queue_reqs{{model_name="m"}} {queue}']
    cum = 0
    for b in BOUNDS:
        cum += counts.get(b, 0)
        lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="{float(b)}",model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_count{{model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_sum{{model_name="m"}} {cum * 50}')
    return "\n".join(lines) + "\n"


def test_quantile_bucket_and_the_clock() -> None:
    b = [(100.0, 10.0), (200.0, 100.0), (float("inf"), 100.0)]
    assert quantile_bucket(0.95, b) == (100.0, 200.0, 100.0 + 100.0 * (95 - 10) / 90)
    assert histogram_quantile(0.95, b) > 190  # the plain interpolation
    assert histogram_quantile(0.95, b, at_most=141.0) == 100.0  # no TTFT can be longer than 141 s: "> 100 s"
    assert histogram_quantile(0.95, b, at_most=500.0) > 190


def test_a_scraped_p95_past_the_elapsed_time_reads_as_the_bucket_floor() -> None:
    """The issue's case: p95 interpolated to 176 s in the 100-200 s bucket 141 s after the server was idle."""
    tl = Timeline(target="t")
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    t0 = 1_790_000_000.0
    mt.ingest_text(_expo(0, 0, {}), t0, tl)  # idle: nothing running or waiting
    mt.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl)
    mt.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl)
    s = tl.get("ttft_seconds_p95")
    assert s is not None and float(s.values[-1]) == 100.0
    assert "> 100 s" in s.sources[-1] and "141 s passed" in s.sources[-1]
    # with no idle moment seen, the clock gives no bound and the interpolation stands
    tl2 = Timeline(target="t")
    mt2 = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    mt2.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl2)
    mt2.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl2)
    s2 = tl2.get("ttft_seconds_p95")
    assert s2 is not None and float(s2.values[-1]) > 150


def _bounded_run() -> tuple[Timeline, MetricsTarget]:
    tl = Timeline(target="t")
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    t0 = 1_790_000_000.0
    mt.ingest_text(_expo(0, 0, {}), t0, tl)
    mt.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl)
    mt.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl)
    tl.meta["window_quantiles"] = ADAPTER.window_quantiles(mt.state)
    return tl, mt


def test_the_window_quantile_is_a_floor_and_every_output_says_the_range() -> None:
    """The text headline, the markdown card, the JSON signals and the web tile say "> 100", never "100" alone."""
    from diagnoser.floor import Floor
    from diagnoser.live import window_stats
    from diagnoser.outputs.markdown import render_markdown
    from diagnoser.outputs.report import signal_table
    from diagnoser.outputs.term import Term
    from diagnoser.outputs.text import _headline
    from diagnoser.web.views import headline

    tl, _ = _bounded_run()
    wq = tl.meta["window_quantiles"]
    assert isinstance(wq["ttft_seconds_p95"], Floor) and wq["ttft_seconds_p95"] == 100.0
    assert wq["ttft_seconds_p95"].hi == 200.0
    sigs = signal_table(tl)
    st = sigs["ttft_seconds_p95"]
    assert st["window"] == 100.0 and "window" in st["lower_bounds"] and "max" in st["lower_bounds"]
    assert type(st["window"]) is float  # JSON: a plain number beside the marker
    doc = {"signals": {"t": sigs}, "config": {}, "findings": [], "targets": ["t"], "top": {}}
    text = "\n".join(_headline(Term(width=120), doc, "t", sigs))
    assert "TTFT p95 s > 100.00" in text
    card = render_markdown({**doc, "status": "problems", "inputs": []})
    assert "TTFT p95 s > 100.00" in card, card

    ws = window_stats(tl, 1_790_000_000.0, 1_790_000_141.0)
    view = type("View", (), {"window_stats": ws, "latest": {}, "config": {}})  # what serve's TargetView gives the tiles
    tile = next(x for x in headline(view) if x["signal"] == "ttft_seconds_p95")
    assert tile["max_text"].startswith("> 100.00") and "max" in tile["lower_bound"]


def test_an_unbounded_quantile_prints_as_it_was() -> None:
    from diagnoser.outputs.report import signal_table
    from diagnoser.outputs.term import Term
    from diagnoser.outputs.text import _headline

    tl = Timeline(target="t")
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    t0 = 1_790_000_000.0
    mt.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl)  # no idle moment seen: no bound
    mt.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl)
    tl.meta["window_quantiles"] = ADAPTER.window_quantiles(mt.state)
    sigs = signal_table(tl)
    assert "lower_bounds" not in sigs["ttft_seconds_p95"]
    text = "\n".join(_headline(Term(width=120), {"config": {}}, "t", sigs))
    assert "> " not in text and "TTFT p95 s 1" in text


def test_evidence_of_a_bounded_point_says_its_range() -> None:
    from diagnoser.rules.base import RuleContext, ev

    tl, _ = _bounded_run()
    ctx = RuleContext(timeline=tl, thresholds={}, adapter=ADAPTER)
    e = ev(ctx, "ttft_seconds_p95", 100.0, 30.0, at="max")
    assert e.bound == "> 100 s" and e.to_dict()["bound"] == "> 100 s"
    e2 = ev(ctx, "running_reqs", 8.0, at="max")
    assert e2.bound == "" and "bound" not in e2.to_dict()


def test_the_fleet_path_bounds_a_ttft_quantile_past_the_clock() -> None:
    """--prometheus: Prometheus' interpolated 176 s, 141 s after the target was idle, becomes "> 100 s"."""
    from diagnoser.engines.sglang.versions import VersionRange
    from diagnoser.fleet.bounds import bound_quantiles
    from diagnoser.floor import is_floor

    tl = Timeline(target="t")
    t0 = 1_790_000_000.0
    for dt, run, queue in ((0, 0, 0), (60, 8, 40), (141, 8, 40)):
        tl.add("running_reqs", t0 + dt, run, "prometheus sglang:num_running_reqs")
        tl.add("queue_reqs", t0 + dt, queue, "prometheus sglang:num_queue_reqs")
    tl.add("ttft_seconds_p95", t0 + 60, 40.0, "prometheus histogram_quantile(0.95, …)")
    tl.add("ttft_seconds_p95", t0 + 141, 176.0, "prometheus histogram_quantile(0.95, …)")
    vr = VersionRange(low=(0, 5, 23), high=(0, 5, 23))
    assert bound_quantiles(tl, vr) == 1
    s = tl.get("ttft_seconds_p95")
    assert s is not None and s.values.tolist() == [40.0, 100.0]
    assert not is_floor(source=s.sources[0]) and is_floor(source=s.sources[1]) and "141 s passed" in s.sources[1]
    # never idle in the range: no bound from the clock, Prometheus' value stands
    tl2 = Timeline(target="t")
    tl2.add("running_reqs", t0, 8, "p")
    tl2.add("queue_reqs", t0, 40, "p")
    tl2.add("ttft_seconds_p95", t0 + 141, 176.0, "p")
    assert bound_quantiles(tl2, vr) == 0 and tl2.get("ttft_seconds_p95").values.tolist() == [176.0]  # type: ignore[union-attr]


def test_the_fleet_path_bounds_every_latency_quantile_with_the_buckets_prometheus_holds() -> None:
    """--prometheus: ITL, e2e and queue-time quantiles are bounded like TTFT, with the bucket bounds read
    from Prometheus' ``count by (__name__, le)`` answer; bounds the targets disagree on give no bucket."""
    from diagnoser.engines.sglang.versions import VersionRange
    from diagnoser.fleet.bounds import bound_quantiles, bucket_query, shared_bounds
    from diagnoser.floor import is_floor

    q = bucket_query('job="x"')
    assert q.startswith("count by (__name__, le) (") and "e2e_request_latency_seconds" in q and "queue_time_seconds" in q
    assert '_bucket"' in q and 'job="x"' in q

    def rows(name: str, les: list[str], n: float = 2.0) -> list[dict[str, object]]:
        return [{"metric": {"__name__": name, "le": le}, "values": [[0, "1"], [60, str(n)]]} for le in les]

    answer = (rows("sglang:e2e_request_latency_seconds_bucket", ["10", "20", "60", "120", "+Inf"])
              + rows("sglang_queue_time_seconds_bucket", ["1", "5", "50", "+Inf"])
              + rows("sglang:inter_token_latency_seconds_bucket", ["0.1", "+Inf"])
              + rows("sglang:inter_token_latency_seconds_bucket", ["0.2"], n=1.0))  # one target has other bounds
    got = shared_bounds(answer)
    assert got == {"e2e_request_latency_seconds": (10.0, 20.0, 60.0, 120.0), "queue_time_seconds": (1.0, 5.0, 50.0)}

    tl = Timeline(target="t")
    t0 = 1_790_000_000.0
    for dt, run, queue in ((0, 0, 0), (30, 8, 40), (70, 8, 40)):
        tl.add("running_reqs", t0 + dt, run, "prometheus sglang:num_running_reqs")
        tl.add("queue_reqs", t0 + dt, queue, "prometheus sglang:num_queue_reqs")
    e2e = "prometheus histogram_quantile(0.95, sglang:e2e_request_latency_seconds[5s])"
    tl.add("e2e_seconds_p95", t0 + 30, 15.0, e2e)  # within the clock
    tl.add("e2e_seconds_p95", t0 + 70, 100.0, e2e)  # interpolated in 60-120 s, 70 s after idle: "> 60 s"
    tl.add("queue_time_seconds_p95", t0 + 70, 50.0, "prometheus histogram_quantile(0.95, sglang:queue_time_seconds[5s])")  # +Inf bucket
    itl = "prometheus histogram_quantile(0.95, sglang:inter_token_latency_seconds[5s])"
    tl.add("itl_seconds_p95", t0 + 70, 90.0, itl)  # past the clock, but its bounds are not shared: kept
    assert bound_quantiles(tl, VersionRange(low=(0, 5, 23), high=(0, 5, 23)), got) == 2
    s = tl.get("e2e_seconds_p95")
    assert s is not None and s.values.tolist() == [15.0, 60.0]
    assert not is_floor(source=s.sources[0]) and is_floor(source=s.sources[1]) and "60-120 s bucket (read from Prometheus)" in s.sources[1]
    qt = tl.get("queue_time_seconds_p95")
    assert qt is not None and qt.values.tolist() == [50.0] and is_floor(source=qt.sources[0]) and "last finite bucket" in qt.sources[0]
    i = tl.get("itl_seconds_p95")
    assert i is not None and i.values.tolist() == [90.0] and not is_floor(source=i.sources[0])
