"""Fleet mode, unit level: query plan, selector parsing, auth, target/rank mapping and every bad-input
path, against an httpx.MockTransport standing in for the Prometheus HTTP API. The real Prometheus is
in test_fleet_prometheus.py."""

from __future__ import annotations

import argparse
import base64
import json
import re
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from diagnoser.engines import get_adapter
from diagnoser.engines.sglang import metrics as M
from diagnoser.fleet import collect_prometheus
from diagnoser.fleet import queries as Q
from diagnoser.fleet import source as S
from diagnoser.fleet.promapi import PromAPI, PromError, auth_headers
from diagnoser.fleet.source import deltas, parse_end

END = 1_800_000_000.0


def args(**kw: Any) -> argparse.Namespace:
    base = {"prometheus": "http://prom.test:9090", "selector": "", "range": 60.0, "step": 15.0, "rate_window": 60.0,
            "end": END, "timeout": 5.0, "bearer_token": None, "basic_auth": None, "header": []}
    base.update(kw)
    return argparse.Namespace(**base)


def matrix(metric: dict[str, str], values: list[float], start: float = END - 60, step: float = 15) -> dict[str, Any]:
    return {"metric": metric, "values": [[start + i * step, repr(v) if v == v else "NaN"] for i, v in enumerate(values)]}


def ok(data: Any) -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": data})


class FakeProm:
    """Answers by the metric name a query selects; records every request."""

    def __init__(self, series: list[dict[str, str]], results: dict[str, list[dict[str, Any]]],
                 fail: dict[str, httpx.Response] | None = None, config: list[dict[str, Any]] | None = None) -> None:
        self.series, self.results, self.fail, self.config = series, results, fail or {}, config or []
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.jobs = ["node", "sglang"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode()) if request.method == "POST" else parse_qs(request.url.query.decode())
        path = request.url.path
        self.requests.append((path, form))
        if path == "/api/v1/series":
            return ok(self.series)
        if path.startswith("/api/v1/label/"):
            return ok(self.jobs)
        q = form["query"][0]
        for key, resp in self.fail.items():
            if key in q:
                return resp
        if path == "/api/v1/query":
            if q.startswith("count by (job)"):
                return ok({"resultType": "vector", "result": [{"metric": {"job": "sglang-b"}, "value": [END, "3"]}]})
            return ok({"resultType": "vector", "result": []})
        if "max_total_num_tokens|" in q:  # the config gauges
            return ok({"resultType": "matrix", "result": self.config})
        m = re.search(r'__name__=~"sglang\[:_\]\(?([a-z_|]+)', q)
        names = [n.removesuffix("_bucket") for n in m.group(1).split("|")] if m else []
        for key, res in self.results.items():
            if key in names and (("histogram_quantile" in q) == key.endswith("_seconds")):
                return ok({"resultType": "matrix", "result": res})
            if key + ":buckets" in self.results and key in names and q.startswith("rate("):  # the bare bucket rates
                return ok({"resultType": "matrix", "result": self.results[key + ":buckets"]})
        return ok({"resultType": "matrix", "result": []})


def collect(fake: FakeProm, **kw: Any) -> Any:
    api = PromAPI("http://prom.test:9090", timeout=5.0, client=httpx.Client(transport=httpx.MockTransport(fake)))
    return collect_prometheus(args(**kw), get_adapter(), api=api)


A = {"job": "sglang", "instance": "a:30000", "model_name": "m"}
B = {"job": "sglang", "instance": "b:30000", "model_name": "m"}


def test_selector_parsing() -> None:
    assert Q.parse_selector('{job="sglang"}') == 'job="sglang"'
    assert Q.parse_selector('job="sglang", cluster=~"eu-.*"') == 'job="sglang", cluster=~"eu-.*"'
    assert Q.parse_selector("") == ""
    for bad in ('{__name__="x"}', "{job=sglang}", 'up{job="x"}', "{job"):
        with pytest.raises(ValueError) as e:
            Q.parse_selector(bad)
        assert "--selector" in str(e.value) and "\n" not in str(e.value)


def test_plan_is_one_query_per_signal_for_the_whole_fleet() -> None:
    plan = Q.plan('job="sglang"', 15, 60)
    for q in plan:
        assert 'sglang[:_]' in q.promql, q.promql  # both spellings
        assert 'job="sglang"' in q.promql
        assert "instance=" not in q.promql  # never one query per target
    kinds = {q.signal: q.kind for q in plan}
    # every mapping of the adapter is covered (reused, not duplicated)
    assert set(M.GAUGES.values()) <= set(kinds)
    assert {s for s, _t in M.COUNTERS.values() if s} <= set(kinds)
    rate = next(q for q in plan if q.signal == "request_rate")
    assert rate.promql.startswith("rate({") and rate.promql.endswith("[60s])")
    p95 = next(q for q in plan if q.signal == "ttft_seconds_p95")
    assert p95.promql.startswith("histogram_quantile(0.95, sum by (le, ") and "_bucket" in p95.promql
    assert len([q for q in plan if q.signal == "running_reqs"]) == 1


@pytest.mark.parametrize("local", [False, True], ids=["quantiles-by-prometheus", "quantiles-here"])
def test_targets_ranks_spellings_and_values(local: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "_LOCAL_QUANTILES", local)
    series = [{"__name__": "sglang:evicted_tokens_total", "job": "sglang", "instance": "a:30000", "cache_type": "RadixCache"},
              {"__name__": "sglang:num_running_reqs", **A, "tp_rank": "0", "engine_type": "unified", "moe_ep_rank": "0"},
              {"__name__": "sglang_num_running_reqs", **B, "dp_rank": "0", "tp_rank": "0"},
              {"__name__": "sglang_num_running_reqs", **B, "dp_rank": "1", "tp_rank": "1"},
              {"__name__": "sglang:prealloc_full_token_usage", **A}]
    running = [matrix({**A, "tp_rank": "0"}, [4, 4, 5, 5, 5]),
               matrix({**A, "tp_rank": "1"}, [9, 9, 9, 9, 9]),  # a non-stats TP rank: ignored
               matrix({**B, "dp_rank": "0", "tp_rank": "0"}, [1, 2, 3, 4, float("nan")]),
               matrix({**B, "dp_rank": "1", "tp_rank": "1"}, [10, 10, 10, 10, 10])]
    http = [matrix({"job": "sglang", "instance": "a:30000"}, [3, 3, 3, 3, 3])]  # no model_name label
    ttft = [matrix(A, [0.39, 0.39, 0.39], step=60)]
    # the same p95 from bucket rates: nothing up to 0.2 s, everything by 0.4 s: 0.2 + 0.2 * 0.95
    ttft_buckets = [matrix({**A, "le": le}, [c, c, c], step=60) for le, c in (("0.2", 0.0), ("0.4", 2.0), ("+Inf", 2.0))]
    retr = [matrix({**A, "tp_rank": "0"}, [5, 5, 7, 7, 1])]  # restart at the end
    fake = FakeProm(series, {"num_running_reqs": running, "http_requests_active": http,
                             "time_to_first_token_seconds": ttft, "time_to_first_token_seconds:buckets": ttft_buckets,
                             "num_retracted_requests_total": retr},
                    config=[{"metric": {"__name__": "sglang_max_total_num_tokens", **A, "tp_rank": "0"},
                             "values": [[END - 60, "65536"], [END, "NaN"]]}])
    col = collect(fake)
    tls = {tl.target: tl for tl in col.timelines}
    assert sorted(tls) == ["a:30000", "b:30000"]
    a, b = tls["a:30000"], tls["b:30000"]
    assert a.get("running_reqs").values.tolist() == [4, 4, 5, 5, 5]
    assert a.get("http_requests_active").values.tolist() == [3, 3, 3, 3, 3]
    want = pytest.approx([0.39] * 3, abs=1e-12) if local else [0.39] * 3  # (0.2 + 0.2 * 0.95 is 0.39 to a few ulps)
    assert a.get("ttft_seconds_p95").values.tolist() == want
    assert a.get("retracted_reqs").values.tolist() == [0, 2, 0, 1]  # per-step increase; the drop counts from 0
    assert a.get("retractions_total").values.tolist() == [5, 5, 7, 7, 1]
    assert a.cfg("max_total_tokens") == 65536
    assert b.get("running_reqs", "dp0").values.tolist() == [1, 2, 3, 4]
    assert b.get("running_reqs", "dp1").values.tolist() == [10] * 5
    assert b.get("running_reqs").values[:4].tolist() == [11, 12, 13, 14]  # aggregate = sum over DP ranks
    assert a.meta["spelling"] == ["sglang:"] and b.meta["spelling"] == ["sglang_"]
    assert a.version == ">=0.5.23" and b.version != ">=0.5.23"
    # one query per signal; nothing per target
    queries = [f["query"][0] for p, f in fake.requests if p == "/api/v1/query_range"]
    plan = Q.plan("", 15, 60)
    # + the config gauges, the bucket bounds and the vLLM series (fleet/vllm.py); quantiles here: one rate query per histogram
    saved = sum(1 for q in plan if q.kind == "quantile") - len(Q.bucket_rates(plan, "", 60)) if local else 0
    assert len(queries) == len(plan) + 3 - saved
    assert any(q.startswith("histogram_quantile") for q in queries) != local
    assert not any("a:30000" in q for q in queries)
    assert all(f.get("timeout") == ["5s"] for p, f in fake.requests if p == "/api/v1/query_range")


def test_failed_query_is_reported_per_signal_and_the_rest_goes_on() -> None:
    series = [{"__name__": "sglang:num_running_reqs", **A}, {"__name__": "sglang:num_running_reqs", **B}]
    timeout = httpx.Response(503, json={"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"})
    fake = FakeProm(series, {"num_running_reqs": [matrix(A, [1, 1, 1, 1, 1]), matrix(B, [2, 2, 2, 2, 2])],
                             "num_queue_reqs": [matrix(A, [0, 0, 0, 0, 0])]},
                    fail={"sglang[:_]token_usage": timeout})
    col = collect(fake)
    msgs = col.inputs[0].messages
    line = next(m for m in msgs if m.startswith("token_usage is missing for all 2 targets"))
    assert "HTTP 503" in line and "query timed out" in line and "token_usage" in line
    assert any("1 target(s) have no queue_reqs" in m and "b:30000" in m for m in msgs)
    tls = {tl.target: tl for tl in col.timelines}
    assert tls["b:30000"].meta["missing_signals"] == ["queue_reqs", "token_usage"]
    assert tls["a:30000"].get("running_reqs").values.tolist() == [1] * 5
    assert col.fleet["failed_queries"].keys() == {"token_usage"}


@pytest.mark.parametrize("status,body,expect", [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 12"}, "HTTP 400 to /api/v1/series"),
    (401, "Unauthorized", "HTTP 401"),
    (404, "<html>404 page not found</html>", "an HTML page"),
    (500, {"status": "error", "errorType": "internal", "error": "boom"}, "internal: boom"),
])
def test_http_errors_are_one_line_naming_query_and_answer(status: int, body: Any, expect: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, **({"json": body} if isinstance(body, dict) else {"text": body}))

    api = PromAPI("http://u:hunter2@prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(handler)))
    col = collect_prometheus(args(bearer_token="s3cret-token"), get_adapter(), api=api)
    msg = col.inputs[0].messages[0]
    assert expect in msg and "sglang[:_]" in msg and "\n" not in msg
    assert "hunter2" not in msg and "s3cret" not in msg
    assert not col.timelines and not col.usable()


def test_unreachable_prometheus() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    api = PromAPI("http://prom.test:9090", client=httpx.Client(transport=httpx.MockTransport(refuse)))
    col = collect_prometheus(args(), get_adapter(), api=api)
    msg = col.inputs[0].messages[0]
    assert msg.startswith("Prometheus at http://prom.test:9090 is unreachable (connection refused) for /api/v1/series")
    assert "check the --prometheus URL" in msg


def test_selector_matching_nothing_lists_the_jobs() -> None:
    fake = FakeProm([], {})
    col = collect(fake, selector='{job="nope"}')
    msg = col.inputs[0].messages[0]
    assert 'The selector {job="nope"} matches no SGLang series' in msg
    assert "Jobs with SGLang series: sglang-b" in msg and "Other jobs: node, sglang." in msg


def test_auth_headers(tmp_path: Any) -> None:
    assert auth_headers(bearer_token="abc") == {"Authorization": "Bearer abc"}
    f = tmp_path / "cred"
    f.write_text("alice:pw\n")
    h = auth_headers(basic_auth=f"@{f}", headers=["X-Scope-OrgID: team-a"])
    assert h["Authorization"] == "Basic " + base64.b64encode(b"alice:pw").decode()
    assert h["X-Scope-OrgID"] == "team-a"
    for kw in ({"basic_auth": "nocolon"}, {"headers": ["no-colon"]}, {"bearer_token": "@/nonexistent/x"}):
        with pytest.raises(ValueError):
            auth_headers(**kw)  # type: ignore[arg-type]
    seen: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.headers)
        return ok([])

    api = PromAPI("http://prom.test", headers=auth_headers(bearer_token="tok", headers=["X-Scope-OrgID: t"]),
                  client=None)
    api.client = httpx.Client(transport=httpx.MockTransport(handler), headers=api.client.headers)  # type: ignore[union-attr]
    api.series("{}", 0, 1)
    assert seen["authorization"] == "Bearer tok" and seen["x-scope-orgid"] == "t"


def test_bad_options_are_one_sentence() -> None:
    col = collect(FakeProm([], {}), selector="{job=sglang}")
    assert "--selector" in col.inputs[0].messages[0]
    col = collect(FakeProm([], {}), end="yesterday")
    assert col.inputs[0].messages[0].startswith("--end 'yesterday' is not a time")
    assert parse_end("2026-11-29T10:00:00Z") == 1795946400.0
    assert parse_end("now") is None


def test_deltas() -> None:
    assert deltas([1, 3, 3, 10, 2]) == [2, 0, 7, 2]
    assert deltas([5]) == []


def test_invalid_json_answer() -> None:
    api = PromAPI("http://prom.test", client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, text="ok"))))
    with pytest.raises(PromError) as e:
        api.query("up", END)
    assert "answered HTTP 200" in str(e.value) and json.dumps("ok") not in str(e.value)


def test_target_cap_and_ignored_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnoser.fleet.source as S

    monkeypatch.setattr(S, "MAX_TARGETS", 1)
    series = [{"__name__": "sglang:num_running_reqs", **A}, {"__name__": "sglang:num_running_reqs", **B}]
    fake = FakeProm(series, {"num_running_reqs": [matrix(A, [1, 1, 1, 1, 1]), matrix(B, [2, 2, 2, 2, 2])]})
    col = collect(fake, url=["http://x:30000"])
    assert [tl.target for tl in col.timelines] == ["a:30000"]
    msgs = col.inputs[0].messages
    assert any(m.startswith("2 targets match; the first 1 (by job and instance) are read.") for m in msgs)
    assert any(m.startswith("--url and --log are not read with --prometheus") for m in msgs)


def test_partial_response_warning_is_reported() -> None:
    series = [{"__name__": "sglang:num_running_reqs", **A}]
    warn = httpx.Response(200, json={"status": "success", "warnings": ["partial response: store eu-2 unreachable"],
                                     "data": {"resultType": "matrix", "result": [matrix(A, [3, 3, 3, 3, 3])]}})
    fake = FakeProm(series, {}, fail={"sglang[:_](num_running_reqs|": warn})
    col = collect(fake)
    assert col.timelines[0].get("running_reqs").values.tolist() == [3] * 5
    assert any("Prometheus warned on" in m and "partial response: store eu-2 unreachable" in m for m in col.inputs[0].messages)


class RefusesBucketRates(FakeProm):
    """Refuses the bare bucket-rate queries (as a store with a low --query.max-samples, or an answer past the
    cap, would) and answers the histogram_quantile ones."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode()) if request.method == "POST" else {}
        q = form.get("query", [""])[0]
        if q.startswith("rate(") and "_bucket" in q:
            self.requests.append((request.url.path, form))
            return httpx.Response(422, json={"status": "error", "errorType": "execution", "error": "query processing would load too many samples"})
        return super().__call__(request)


def test_refused_bucket_rates_fall_back_to_prometheus_quantiles() -> None:
    series = [{"__name__": "sglang:num_running_reqs", **A}]
    fake = RefusesBucketRates(series, {"num_running_reqs": [matrix(A, [1, 1, 1, 1, 1])],
                                       "time_to_first_token_seconds": [matrix(A, [0.39, 0.39, 0.39], step=60)]})
    col = collect(fake)
    (tl,) = col.timelines
    assert tl.get("ttft_seconds_p95").values.tolist() == [0.39] * 3  # asked of Prometheus after the refusal
    assert not col.fleet["failed_queries"]
    queries = [f["query"][0] for _p, f in fake.requests if "query" in f]
    bare = [q for q in queries if q.startswith("rate(") and "_bucket" in q]
    assert bare and any(q.startswith("histogram_quantile(0.95") and "time_to_first_token" in q for q in queries)
    # each refused histogram's quantiles were asked instead (and only those: one per quantile query of the plan)
    plan = Q.plan("", 15, 60)
    assert sum(q.startswith("histogram_quantile") for q in queries) == sum(1 for q in plan if q.kind == "quantile")


def test_answers_are_asked_uncompressed_only_on_loopback() -> None:
    """gzip pays across a network (answers compress 50-70x); on loopback it only costs CPU on both ends."""
    from diagnoser.fleet.promapi import PromAPI, _loopback

    for url in ("http://127.0.0.1:9090", "localhost:9090", "http://[::1]:9090", "http://127.5.5.5", "http://u:pw@127.0.0.1:1/x"):
        assert _loopback(PromAPI(url).url), url
    for url in ("http://10.0.0.1:9090", "https://prom.example:9090", "http://localhost.example", "http://[::ffff:10.0.0.1]"):
        assert not _loopback(PromAPI(url).url), url
    near, far = PromAPI("http://127.0.0.1:9090"), PromAPI("https://prom.example:9090")
    try:
        assert near.client is not None and near.client.headers["accept-encoding"] == "identity"
        assert far.client is not None and far.client.headers["accept-encoding"] == "gzip, deflate"
    finally:
        near.close()
        far.close()
