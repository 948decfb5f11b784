"""Bad input at the HTTP and exposition level: each case gives one clear sentence with the next step, no
exception, and what can be used is used. Unit tests: httpx.MockTransport stands in for the server (the
end-to-end versions over a real loopback server are in test_once_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from diagnoser.collect import collect_once
from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.http import base_url, fetch, make_client, url_problem
from diagnoser.sources.metrics import MetricsTarget, parse_exposition
from diagnoser.timeline import Timeline
from tests.conftest import DATA

REAL = DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom"


@pytest.fixture(scope="module")
def real_text(data_dir: Path) -> str:
    return REAL.read_text()


def client_for(handler) -> httpx.Client:  # type: ignore[no-untyped-def]
    return make_client(timeout=1.0, transport=httpx.MockTransport(handler))


def scrape(handler, **kw) -> tuple[bool, MetricsTarget, Timeline]:  # type: ignore[no-untyped-def]
    t = MetricsTarget("http://10.0.0.1:30000", ADAPTER)
    tl = Timeline(target="t")
    with client_for(handler) as c:
        ok, _ = t.scrape(c, tl, **kw)
    return ok, t, tl


def one_sentence_with_next_step(msg: str) -> None:
    assert msg and "Traceback" not in msg
    assert msg.count(". ") <= 2 and msg.endswith(".")


def test_refused_connection() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    ok, t, tl = scrape(handler)
    assert not ok and not tl.series
    assert "connection refused" in t.last_error and "Check that SGLang is running" in t.last_error
    one_sentence_with_next_step(t.last_error)
    assert t.report.errors == 1 and t.report.scrapes == 0


def test_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    ok, t, _ = scrape(handler)
    assert not ok and "did not answer within the timeout" in t.last_error and "--timeout" in t.last_error
    one_sentence_with_next_step(t.last_error)


def test_404_says_enable_metrics() -> None:
    ok, t, _ = scrape(lambda r: httpx.Response(404, text='{"detail":"Not Found"}'))
    assert not ok and "--enable-metrics" in t.last_error and "404" in t.last_error
    one_sentence_with_next_step(t.last_error)


def test_html_page() -> None:
    page = "<!DOCTYPE html><html><head><title>Grafana</title></head><body>login</body></html>"
    ok, t, _ = scrape(lambda r: httpx.Response(200, text=page, headers={"content-type": "text/html; charset=utf-8"}))
    assert not ok and "HTML page" in t.last_error and "host:port" in t.last_error


def test_non_sglang_exposition() -> None:
    text = "# HELP jvm_threads x\n# TYPE jvm_threads gauge\njvm_threads 3.0\n"
    ok, t, _ = scrape(lambda r: httpx.Response(200, text=text))
    assert not ok and t.is_engine is False
    assert "none are SGLang's" in t.last_error and "--enable-metrics" in t.last_error


@pytest.mark.parametrize(("text", "needle"), [
    ("# TYPE sgl_router_requests_total counter\nsgl_router_requests_total{route=\"/generate\"} 5\n", "router"),
    ("REAL_VLLM", "vLLM"),
])
def test_foreign_servers_are_named(text: str, needle: str, data_dir: Path) -> None:
    if text == "REAL_VLLM":  # a real vLLM 0.32 (CPU) /metrics scrape
        text = (data_dir / "vllm" / "vllm-cpu-0.32.0_metrics_run2_midload_kv_full.prom").read_text()
    ok, t, _ = scrape(lambda r: httpx.Response(200, text=text))
    assert not ok and needle in t.last_error
    one_sentence_with_next_step(t.last_error)


def test_not_prometheus_at_all() -> None:
    ok, t, _ = scrape(lambda r: httpx.Response(200, text='{"status": "ok"}\n'))
    assert not ok and "no parseable Prometheus metrics" in t.last_error


def test_exposition_cut_mid_line_keeps_complete_lines(real_text: str) -> None:
    cut = real_text[: real_text.index("sglang:num_queue_reqs{") + 30]  # ends inside a label set
    ok, t, tl = scrape(lambda r: httpx.Response(200, text=cut))
    assert ok
    assert tl.get("running_reqs").values.tolist() == [44.0]  # the complete line before the cut
    assert tl.get("queue_reqs") is None  # the broken line is not guessed at
    assert any("cut off mid-line" in m for m in t.report.messages)


def test_binary_junk_is_skipped_and_counted(real_text: str) -> None:
    lines = real_text.splitlines(keepends=True)
    junk = b"\x00\x17\xff\xfe\x89PNG\r\n\x1a\n".decode("utf-8", errors="replace") + "\n"
    mixed = "".join(lines[:200]) + junk + "".join(lines[200:])
    ok, t, tl = scrape(lambda r: httpx.Response(200, content=mixed.encode("utf-8")))
    assert ok, t.last_error
    assert tl.get("running_reqs").values.tolist() == [44.0] and tl.get("token_usage").values.tolist() == [1.0]
    assert t.report.errors >= 1
    assert any("unreadable line" in m for m in t.report.messages)


def test_only_binary_junk() -> None:
    blob = bytes(range(256)) * 8
    ok, t, tl = scrape(lambda r: httpx.Response(200, content=blob))
    assert not ok and not tl.series and "no parseable Prometheus metrics" in t.last_error


def test_size_cap_cuts_and_uses_the_rest(real_text: str) -> None:
    cap = real_text.index("sglang:token_usage{") + 150  # mid-line, after the running/queue gauges
    ok, t, tl = scrape(lambda r: httpx.Response(200, text=real_text), max_bytes=cap)
    assert ok
    assert any(f"over the {cap:,} bytes cap" in m for m in t.report.messages)
    assert t.report.errors == 1  # the cap tripped: said once and counted
    assert tl.get("running_reqs").values.tolist() == [44.0]  # the complete lines before the cap were read


def test_library_salvage_counts_bad_lines(real_text: str) -> None:
    broken = real_text.replace("sglang:num_queue_reqs{", "sglang:num_queue_reqs{{{", 1)
    pr = parse_exposition(broken)
    assert pr.bad_lines == 1 and pr.families


def test_base_url_and_credentials_never_shown() -> None:
    assert base_url("127.0.0.1:30000/metrics") == "http://127.0.0.1:30000"
    assert base_url("http://h:1/get_server_info") == "http://h:1"
    assert base_url("localhost") == "http://localhost:30000"  # SGLang's default port
    assert base_url("[::1]") == "http://[::1]:30000"
    assert base_url("http://gateway.example/sglang/metrics") == "http://gateway.example/sglang"  # explicit: no port added
    assert url_problem("http://127.0.0.1:30000") is None and url_problem("u:p@h:1") is None
    for bad, needle in [("http://[::1", "not a valid URL"), ("", "not an http(s)"), ("ftp://x", "not an http(s)"),
                        ("http://h:99999", "Port out of range"), ("http://exa mple.com", "not an http(s)")]:
        assert needle in (url_problem(bad) or ""), bad
    assert "pw" not in (url_problem("ftp://u:pw@h") or "")

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with client_for(handler) as c:
        f = fetch(c, "http://admin:hunter2@10.0.0.1:30000/metrics")
    assert not f.ok and "hunter2" not in f.error and "***@" in f.error


def test_collect_once_uses_one_pool_and_keeps_the_good_target(real_text: str) -> None:
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "10.0.0.2":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=real_text)
        return httpx.Response(404)

    client = client_for(handler)
    col = collect_once(ADAPTER, ["http://10.0.0.1:30000", "http://10.0.0.2:30000"], [], duration=2, interval=1,
                       client=client, sleep=lambda s: None)
    assert {"10.0.0.1", "10.0.0.2"} <= set(hosts)  # both targets went through the one client
    assert col.usable()
    good, bad = col.timelines
    assert good.get("running_reqs").values.tolist() == [44.0, 44.0, 44.0]
    assert not bad.series and "connection refused" in col.unreachable[bad.target]
    assert any("connection refused" in e for e in col.errors)


def test_has_junk_gives_the_character_class_answer(real_text: str) -> None:
    from diagnoser.sources.metrics import _JUNK_RE, has_junk

    texts = [real_text, real_text + "é ü 模型\n", ""]
    texts += [real_text[:5000] + chr(c) + real_text[5000:] for c in [*range(0, 32), 0x7F, 0x80, 0xA0, 0xFFFD, 0xFFFE]]
    answers = [has_junk(t) for t in texts]
    assert answers == [_JUNK_RE.search(t) is not None for t in texts]
    assert answers[:3] == [False, False, False] and answers.count(True) == 31  # 0x00–0x1f but \t \n \r (29), 0x7f, U+FFFD


def test_target_client_asks_for_plain_text_and_a_gzipping_server_is_read_the_same(data_dir: Path) -> None:
    """SGLang's /metrics gzips when asked (the loopback sample server does the same): the per-target client
    asks for identity; the shared client takes gzip; both read the same exposition."""
    from diagnoser.sources.http import make_target_client
    from tests.browser.samples_server import SampleServer

    seen: list[str] = []
    with SampleServer(data_dir, "kv-full-retract") as srv:
        srv.set_run("kv-full-retract", skip_idle=False)
        srv.files = srv.files[3:4]  # one scrape, served every time
        with make_target_client(timeout=5.0) as plain, make_client(timeout=5.0) as shared:
            for c in (plain, shared):
                with c.stream("GET", srv.url + "/metrics") as r:
                    seen.append(r.headers.get("content-encoding", "identity"))
            a = fetch(plain, srv.url + "/metrics")
            b = fetch(shared, srv.url + "/metrics")
    assert seen == ["identity", "gzip"]
    assert a.ok and b.ok and a.text == b.text == srv.files[0].read_text()
