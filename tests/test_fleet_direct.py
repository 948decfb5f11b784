"""The fleet rules over several ``--url`` targets (no Prometheus): loopback servers serving REAL
SGLang 0.5.23 scrapes and server info from tests/data/sglang-cpu-real. Four replicas of
``tiny-llama``: long-queue (``--max-running-requests 4``, 36 waiting), kv-full-retract (2,048-token
pool), and two client-bound runs. replica_imbalance must name the busy two; config_drift must flag the
long-queue replica's ``--max-running-requests 4`` against the others' 64, with 64 as the proposal,
and the kv-full replica's pool size."""

from __future__ import annotations

from pathlib import Path

from diagnoser.collect import collect_once
from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from tests.browser.samples_server import SampleServer


def test_fleet_rules_over_url_targets(data_dir: Path) -> None:
    runs = ["long-queue", "kv-full-retract", "client-bound-low-occupancy", "client-bound-low-occupancy"]
    servers = [SampleServer(data_dir, r).start() for r in runs]
    try:
        servers[3].pos = 7  # the second client-bound replica is at another point of its run
        col = collect_once(get_adapter(), [s.url for s in servers], [], duration=4.0, interval=1.0)
    finally:
        for s in servers:
            s.close()
    names = [tl.target for tl in col.timelines]
    lq, kv, idle_a, idle_b = (names[i] for i in range(4))
    report = evaluate(col.timelines, get_adapter())
    imb = [f for f in report.findings if f.rule == "replica_imbalance"]
    assert len(imb) == 1 and imb[0].target == "fleet/tiny-llama"
    hot = {e.signal.split("[")[1].rstrip("]") for e in imb[0].evidence if e.signal.startswith("queue_reqs") and str(e.threshold).startswith(">=")}
    cold = {e.signal.split("[")[1].rstrip("]") for e in imb[0].evidence if e.signal.startswith("queue_reqs") and str(e.threshold).startswith("<")}
    assert hot == {lq, kv} and cold == {idle_a, idle_b}
    drift = {f.target: f for f in report.findings if f.rule == "config_drift"}
    mrr = drift[lq]
    s = next(s for s in mrr.suggestions if s.flag == "--max-running-requests")
    assert (s.current, s.proposed) == (4, 64)
    assert any("server_info" in e.source for e in mrr.evidence)
    pool = drift["fleet/tiny-llama"]
    assert kv in pool.summary and "2,048" in pool.summary and "65,536" in pool.summary
    assert idle_a not in drift and idle_b not in drift
