"""request_outcomes on the ``--prometheus`` path, against a REAL Prometheus (Debian package) on loopback.

Two replicas replay real SGLang 0.5.23 CPU scrapes from tests/data/sglang-cpu-issue25 (queue-full 503s and
context-length 400s; their READMEs give the runs); one job is stored with ``sglang_`` names (the Prometheus 3
/ router rename). The fleet reader must read ``http_responses_total`` by status code and
``num_aborted_requests_total`` in both spellings, so request_outcomes judges each target as it does on a
direct scrape. Skips loudly without the binaries; fails under CI=true.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from diagnoser.fleet import collect_prometheus
from diagnoser.model import Severity
from tests.conftest import DATA
from tests.fleet_fixtures import (
    Prom,
    ReplayReplica,
    need_prometheus,
    scrape_config,
    start_prometheus,
    wait_for_samples,
)

pytestmark = pytest.mark.prometheus
RUNS = DATA / "sglang-cpu-issue25"


def ns(url: str, **kw: Any) -> argparse.Namespace:
    base = {"prometheus": url, "selector": "", "range": 120.0, "step": 1.0, "rate_window": 5.0, "end": None, "timeout": 10.0,
            "bearer_token": None, "basic_auth": None, "header": []}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, dict[str, ReplayReplica]]]:
    need_prometheus()
    reps = {"queue-full": ReplayReplica(RUNS / "queue-full-503"), "context": ReplayReplica(RUNS / "context-length-400")}
    cfg = scrape_config({"sglang": [reps["queue-full"].address], "sglang-us": [reps["context"].address]},
                        interval="500ms", underscore_jobs=("sglang-us",))
    prom = start_prometheus(tmp_path_factory.mktemp("prom-outcomes"), cfg)
    try:  # every file served (42 and 38 scrapes), then the last again
        wait_for_samples(prom.url, '{__name__=~"sglang[:_]num_running_reqs"}', 2, 46, timeout=90)
        yield prom, reps
    finally:
        prom.stop()
        for r in reps.values():
            r.close()


def test_request_outcomes_judges_fleet_targets(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, reps = replicas
    col = collect_prometheus(ns(prom.url), get_adapter())
    tls = {tl.target: tl for tl in col.timelines}
    qf, cl = tls[reps["queue-full"].address], tls[reps["context"].address]
    assert cl.meta["spelling"] == ["sglang_"] and qf.meta["spelling"] == ["sglang:"]
    for tl in (qf, cl):  # the answer counters, POST only (not the scrapes' GET /metrics)
        assert tl.get("http_responses_total") is not None and tl.get("http_errors_total") is not None
    assert qf.get("http_503_total") is not None and max(qf.get("http_503_total").values) == 2190  # type: ignore[union-attr]
    assert max(qf.get("aborted_total").values) == 4  # type: ignore[union-attr]
    # the abort series appears at its first increment, eight scrapes in: it was 0 the step before (the 503s
    # appear at the second scrape, inside the first step here, so their first step holds 71 already)
    for sig in ("aborted_total",):
        s = qf.get(sig)
        assert s is not None and float(s.values[0]) == 0.0 and "not exported yet" in s.sources[0], (sig, s.values[:3].tolist())
    assert cl.get("http_503_total") is None and max(cl.get("http_400_total").values) == 24  # type: ignore[union-attr]
    report = evaluate(col.timelines, get_adapter())
    out = {f.target: f for f in report.findings if f.rule == "request_outcomes"}
    assert set(out) == {qf.target, cl.target}, [(f.rule, f.target) for f in report.findings]
    q = out[qf.target]
    assert q.severity == Severity.CRITICAL and "503" in q.summary, q.summary
    # Prometheus carries no server arguments: --max-queued-requests' current value is unknown, so no change is
    # proposed for it (a direct scrape with server info proposes 8 -> 16); any fix given is for the queue limit
    assert all(s.flag == "--max-queued-requests" for s in q.suggestions), q.suggestions
    c = out[cl.target]
    assert c.severity >= Severity.WARNING and "400" in c.summary, c.summary
    assert all(s.flag == "--context-length" for s in c.suggestions), c.suggestions
    assert all(e.source.startswith("prometheus@") for f in (q, c) for e in f.evidence if e.source)
