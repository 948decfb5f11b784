"""request_outcomes: rejected, aborted and failed requests are findings, by cause, with the share they are."""

from __future__ import annotations

from diagnoser.model import Severity
from diagnoser.rules.rq01_request_outcomes import RequestOutcomes
from tests.rules.helpers import run, window


def _access(status: dict[str, int], posts: int | None = None) -> tuple[str, int, dict[str, object]]:
    paths = {"POST /generate": posts if posts is not None else sum(status.values()), "GET /metrics": 40}
    return ("access_summary", 0, {"requests": sum(status.values()) + 40, "status": status, "paths": paths})


def test_context_length_400s_are_a_warning_with_the_fix_that_fits() -> None:
    """Issue 25: --context-length 512, 79 of 259 requests got 400 and the report said OK."""
    long_ = [("request_too_long", 1, {"input_tokens": 1003, "allowed_tokens": 512, "limit": "context"})]
    tl = window(token_usage=[0.1] * 3, config={"context_len": 512, "max_total_tokens": 65536},
                events=[_access({"200": 180, "400": 79}, posts=259), *long_])
    f = run(RequestOutcomes, tl)
    assert f is not None and f.severity == Severity.CRITICAL  # 30 % >= 20 %
    assert "31%" in f.summary and "400" in f.summary
    (s,) = f.suggestions
    assert s.flag == "--context-length" and s.current == 512 and s.proposed == 1024


def test_queue_full_503s_and_aborts() -> None:
    tl = window(token_usage=[0.1] * 3, config={"arg.max_queued_requests": 8}, events=[_access({"200": 5000, "503": 4345})])
    f = run(RequestOutcomes, tl)
    assert f is not None and f.severity == Severity.CRITICAL and "queue was full" in f.summary
    assert [(s.flag, s.current, s.proposed) for s in f.suggestions] == [("--max-queued-requests", 8, 16)]
    # the counters alone: 138 of 283 aborted (half the streaming clients disconnected)
    tl = window(aborted_total=[0, 60, 138], requests_completed=[0, 70, 145])
    f = run(RequestOutcomes, tl)
    assert f is not None and f.severity == Severity.CRITICAL and "138" in f.summary and not f.suggestions
    assert "timeouts" in f.notes[0]


def test_a_few_failures_are_info_and_none_is_nothing() -> None:
    f = run(RequestOutcomes, window(token_usage=[0.1] * 3, events=[_access({"200": 990, "500": 10})]))
    assert f is not None and f.severity == Severity.INFO
    assert run(RequestOutcomes, window(token_usage=[0.1] * 3, events=[_access({"200": 990})])) is None
    assert run(RequestOutcomes, window(aborted_total=[3, 3, 3], requests_completed=[10, 20, 30])) is None


def test_a_negative_automatic_fraction_gets_the_fraction_sglang_would_start_with() -> None:
    """Issue 25: --chunked-prefill-size -1 on a 24 GB machine, automatic fraction -0.049: the fix is the
    fraction SGLang's formula gives with its default chunk (about 0.72, proposed 0.7), never a larger
    --max-total-tokens and never the failing value again."""
    from diagnoser.rules.er01_oom import OOM

    tl = window(token_usage=[0.0], config={"arg.chunked_prefill_size": -1, "arg.mem_fraction_static": -0.049, "arg.max_prefill_tokens": 16384,
                                                   "arg.device": "cpu"},  # the formula is the release's and the platform's
                events=[("oom", 0, {"phase": "startup", "text": "Loaded weights leave no GPU memory for the KV cache"})])
    f = run(OOM, tl)
    assert f is not None
    (s,) = [s for s in f.suggestions if s.flag == "--mem-fraction-static"]
    assert s.current == -0.049 and s.proposed == 0.7 and "0.71" in s.why
    assert not any(x.flag == "--max-total-tokens" for x in f.suggestions)


def test_the_real_aborts_recording() -> None:
    """Real SGLang 0.5.23 CPU run (tests/data/sglang-cpu-issue25/aborts-half-disconnect): 128 streaming
    requests, every other client closed its stream after the first chunks; num_aborted_requests_total went
    to 64 (its series appears at the first abort, 16 already, so it counts from 0) and num_requests_total
    counts the aborted ones too. request_outcomes calls it critical at about half."""
    from diagnoser.cli.run import analyse, build_parser
    from diagnoser.engines import get_adapter
    from diagnoser.replay import collect_replay
    from tests.conftest import DATA

    adapter = get_adapter("sglang")
    run = DATA / "sglang-cpu-issue25" / "aborts-half-disconnect"
    col = collect_replay(str(run), adapter)
    _report, doc = analyse(build_parser().parse_args(["--once", "--log", "-"]), col, adapter)
    f = doc["findings"][0]
    assert f["rule"] == "request_outcomes" and f["severity"] == "critical", [(x["rule"], x["summary"]) for x in doc["findings"]]
    share = next(e["observed"] for e in f["evidence"] if e["signal"].startswith("share of requests"))
    assert 0.4 <= share <= 0.6, share
    assert "64 request(s) were aborted" in f["summary"]
    assert not f["suggestions"]  # no server flag changes what a client gives up on
    tl = col.timelines[0]
    s = tl.get("aborted_total")
    assert s is not None and float(s.values[0]) == 0.0 and "not exported yet" in s.sources[0]
