"""One cause per run, whatever the input (issue 16, item 3): the log alone (``--log``), the live scrapes
(``--url`` against ``diagnose replay-server`` playing the recording) and a REAL Prometheus that scraped
the same replay name the same top cause and the same first flag to change (its value may differ with
what each input shows; confidence may differ).

Every real CPU-engine run in tests/data/sglang-cpu-real is played at 5x by an in-process replay server;
one Debian ``prometheus`` scrapes all five every 0.5 s while ``diagnose --once --url`` samples each.
Skips loudly without the binary; fails under CI=true.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli.replay_server import ReplayServer
from diagnoser.cli.run import analyse, build_parser
from diagnoser.collect import collect_logs, collect_once
from diagnoser.engines import get_adapter
from diagnoser.fleet import collect_prometheus
from diagnoser.replay import load_source
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA
from tests.fleet_fixtures import need_prometheus, scrape_config, start_prometheus, wait_for_samples

pytestmark = pytest.mark.prometheus
RUNS = sorted(p for p in (DATA / "sglang-cpu-real").iterdir() if p.is_dir())
SPEED = 5.0
ADAPTER = get_adapter("sglang")
# what each run was built to show (its README): the top cause and the first flag to change
EXPECTED = {
    "client-bound-low-occupancy": ("client_bound", None),
    "kv-full-retract": ("kv_saturation", "--max-total-tokens"),
    "long-queue": ("max_running_requests_cap", "--max-running-requests"),
    "medium-engine-bound-kv-full": ("kv_saturation", "--max-total-tokens"),
    "prefill-capped": ("prefill_stall", "--chunked-prefill-size"),
}


def _length(run: Path) -> float:
    ts = [float(m.group(1)) for f in (run / "metrics").glob("*.prom") if (m := re.search(r"_(\d+(?:\.\d+)?)\.prom$", f.name))]
    return max(ts) - min(ts)


def _top(col: Any) -> tuple[str | None, dict[str, Any] | None, dict[str, Any]]:
    args = build_parser().parse_args(["--once", "--log", "-"])
    _report, doc = analyse(args, col, ADAPTER)
    top = next(iter(doc["top"].values()), None)
    return (top["rule"], top["suggestion"], doc) if top else (None, None, doc)


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Per run: the log-only, --url and --prometheus diagnoses (top cause, first change, report)."""
    need_prometheus()
    servers = {run.name: ReplayServer(load_source(str(run)), port=0, speed=SPEED) for run in RUNS}
    addr = {name: s.url.removeprefix("http://") for name, s in servers.items()}
    prom = start_prometheus(tmp_path_factory.mktemp("prom-xsrc"), scrape_config({"sglang": list(addr.values())}, interval="500ms"))
    out: dict[str, dict[str, Any]] = {name: {} for name in servers}
    try:
        t0 = time.time()
        for s in servers.values():
            s.start()

        def sample(name: str) -> None:
            run = DATA / "sglang-cpu-real" / name
            out[name]["url"] = _top(collect_once(ADAPTER, [servers[name].url], [], duration=_length(run) / SPEED + 1.0,
                                                 interval=2.0 / SPEED))

        threads = [threading.Thread(target=sample, args=(n,)) for n in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        end = time.time()
        wait_for_samples(prom.url, '{__name__="sglang:num_running_reqs"}', len(servers), 4)
        ns = argparse.Namespace(prometheus=prom.url, selector="", range=end - t0 + 1.0, step=0.5, rate_window=2.0, end=str(end),
                                timeout=10.0, bearer_token=None, basic_auth=None, header=[])
        col = collect_prometheus(ns, ADAPTER)
        by_addr = {tl.target: tl for tl in col.timelines}
        for name, a in addr.items():
            one = type(col)()
            one.timelines = [by_addr[a]]
            one.inputs = list(by_addr[a].inputs)
            out[name]["prometheus"] = _top(one)
        for run in RUNS:
            out[run.name]["log"] = _top(collect_logs(ADAPTER, [str(run / "server.log")]))
        yield out
    finally:
        prom.stop()
        for s in servers.values():
            s.stop()


@pytest.mark.parametrize("run", [r.name for r in RUNS])
def test_log_url_and_prometheus_name_one_cause(played: dict[str, dict[str, Any]], run: str) -> None:
    got = played[run]
    seen: dict[str, Any] = {k: (v[0], (v[1] or {}).get("flag"), (v[1] or {}).get("proposed")) for k, v in got.items()}
    seen["prometheus config"] = {k: v["value"] for k, v in next(iter(got["prometheus"][2]["config"].values())).items()}
    seen["prometheus inputs"] = got["prometheus"][2]["inputs"]
    rules = {v[0] for v in got.values()}
    assert rules == {EXPECTED[run][0]}, seen
    flags = {(v[1] or {}).get("flag") for v in got.values()}
    assert flags == {EXPECTED[run][1]}, seen
    values = [v[1]["proposed"] for v in got.values() if v[1] and isinstance(v[1]["proposed"], int | float)]
    if values:  # the size may differ with what each input shows, within a factor of two, and always up
        assert max(values) <= 2 * min(values), seen
        cur = [v[1]["current"] for v in got.values() if v[1] and isinstance(v[1]["current"], int | float)]
        assert all(p > c for p in values for c in cur), seen


def test_no_cuda_graph_warning_on_a_cpu_server_from_prometheus(played: dict[str, dict[str, Any]]) -> None:
    """Prometheus carries no device: eager decode alone cannot tell a CPU server from disabled graphs."""
    for run, got in played.items():
        doc = got["prometheus"][2]
        cg = [f for f in doc["findings"] if f["rule"] == "cuda_graph_disabled_or_exceeded"]
        assert all(f["severity"] == "info" and not f["suggestions"] for f in cg), (run, cg)
        assert not any(f["rule"] == "cuda_graph_disabled_or_exceeded" for f in got["log"][2]["findings"])


def test_signals_are_derived_the_same_way(played: dict[str, dict[str, Any]]) -> None:
    """Tokens per request (decode moments only) and the window rates agree across the inputs."""
    from diagnoser.timeline.derived import decode_tokens_per_request

    for run in RUNS:
        log = collect_logs(ADAPTER, [str(run / "server.log")]).timelines[0]
        scr = Timeline(target="t")
        target = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
        for f in sorted((run / "metrics").glob("*.prom")):
            target.ingest_text(f.read_text(), float(f.stem.split("_")[-1]), scr)
        scr.aggregate_ranks()
        a, b = decode_tokens_per_request(log).value, decode_tokens_per_request(scr).value
        assert a and b and 0.75 < a / b < 1.33, (run.name, a, b)
        # the log's #token / #running-req of the Decode lines, never a Prefill line's running count
        assert a < 2 * max(v for v in (log.get("used_tokens").values / 1.0)) / 1.0

