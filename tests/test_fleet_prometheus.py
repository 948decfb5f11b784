"""Fleet mode against a REAL Prometheus (Debian package) on loopback.

(a) Prometheus scrapes four replica servers replaying real SGLang 0.5.23 scrapes from
    tests/data/sglang-cpu-real: long-queue and kv-full-retract (saturated), two client-bound runs
    (idle); one job is stored with ``sglang_`` names (metric_relabel_configs, the Prometheus 3 /
    router rename) — replica_imbalance must name the saturated ones.
(b) A generated 1,000-target fleet backfilled with ``promtool tsdb create-blocks-from openmetrics``
    (half ``sglang:``, half ``sglang_``): values, server-side rates and quantiles, fleet rules, the
    report, and a real partial failure (``--query.max-samples``).
Skips loudly without the binaries; fails under CI=true.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines import get_adapter
from diagnoser.engines.sglang import metrics as M
from diagnoser.evaluate import evaluate
from diagnoser.fleet import collect_prometheus
from diagnoser.model import Severity
from diagnoser.outputs.report import build
from tests.conftest import DATA
from tests.fleet_fixtures import (
    TTFT_BUCKETS,
    FleetSpec,
    Prom,
    ReplayReplica,
    fleet_prometheus,
    free_port,
    need_prometheus,
    scrape_config,
    start_prometheus,
    wait_for_samples,
)

pytestmark = pytest.mark.prometheus
RUNS = DATA / "sglang-cpu-real"
DIAGNOSE = [sys.executable, "-m", "diagnoser"]


def ns(url: str, **kw: Any) -> argparse.Namespace:
    base = {"prometheus": url, "selector": "", "range": 60.0, "step": 1.0, "rate_window": 5.0, "end": None, "timeout": 10.0,
            "bearer_token": None, "basic_auth": None, "header": []}
    base.update(kw)
    return argparse.Namespace(**base)


# -- (a) replicas replaying real scrapes ------------------------------------------------------------
@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, dict[str, ReplayReplica]]]:
    need_prometheus()
    reps = {
        "long-queue": ReplayReplica(RUNS / "long-queue", 2, 24),  # busy part of the run
        "kv-full": ReplayReplica(RUNS / "kv-full-retract", 2, 16),
        "idle-a": ReplayReplica(RUNS / "client-bound-low-occupancy", 3, 24),
        "idle-b": ReplayReplica(RUNS / "client-bound-low-occupancy", 5, 26),
    }
    cfg = scrape_config({"sglang": [reps[k].address for k in ("long-queue", "kv-full", "idle-a")],
                         "sglang-us": [reps["idle-b"].address], "other": [f"127.0.0.1:{free_port()}"]},
                        interval="500ms", underscore_jobs=("sglang-us",))
    prom = start_prometheus(tmp_path_factory.mktemp("prom-replicas"), cfg)
    try:
        wait_for_samples(prom.url, '{__name__=~"sglang[:_]num_running_reqs"}', 4, 8)
        yield prom, reps
    finally:
        prom.stop()
        for r in reps.values():
            r.close()


def _served(run: str, first: int, last: int, name: str) -> set[float]:
    vals = set()
    for f in sorted((RUNS / run / "metrics").glob("*.prom"))[first:last]:
        for n, _labels, v in M.fast_samples(f.read_text()):
            if n == name:
                vals.add(v)
    return vals


def test_replica_imbalance_names_the_saturated_replicas(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, reps = replicas
    col = collect_prometheus(ns(prom.url), get_adapter())
    tls = {tl.target: tl for tl in col.timelines}
    addr = {k: r.address for k, r in reps.items()}
    assert set(tls) == set(addr.values())
    # values are the served ones, whatever the spelling
    lq = tls[addr["long-queue"]]
    assert set(lq.get("queue_reqs").values) <= _served("long-queue", 2, 24, "num_queue_reqs")
    assert lq.cfg("max_total_tokens") == 65536 and tls[addr["kv-full"]].cfg("max_total_tokens") == 2048
    assert tls[addr["idle-b"]].meta["spelling"] == ["sglang_"] and lq.meta["spelling"] == ["sglang:"]
    assert set(tls[addr["idle-b"]].get("running_reqs").values) <= _served("client-bound-low-occupancy", 5, 26, "num_running_reqs")
    assert lq.version == ">=0.5.23"
    assert (lq.stats("ttft_seconds_p95")["max"] or 0) > 1.0 > (tls[addr["idle-a"]].stats("ttft_seconds_p95")["max"] or 9)

    report = evaluate(col.timelines, get_adapter())
    imb = [f for f in report.findings if f.rule == "replica_imbalance"]
    assert len(imb) == 1, [f.summary for f in report.findings]
    f = imb[0]
    assert f.target == "fleet/tiny-llama" and f.severity == Severity.WARNING
    hot = {e.signal.split("[")[1].rstrip("]") for e in f.evidence if e.signal.startswith("queue_reqs") and str(e.threshold).startswith(">=")}
    cold = {e.signal.split("[")[1].rstrip("]") for e in f.evidence if e.signal.startswith("queue_reqs") and str(e.threshold).startswith("<")}
    assert hot == {addr["long-queue"], addr["kv-full"]}
    assert cold == {addr["idle-a"], addr["idle-b"]}
    busy_part, room_part = f.summary.split(" while ")[0], f.summary.split(" while ")[1]
    assert addr["long-queue"] in busy_part and addr["idle-a"] not in busy_part and addr["idle-b"] in room_part
    assert all(e.source.startswith("prometheus@") for e in f.evidence if e.signal.startswith("queue_reqs"))
    # the per-target rules ran unchanged on the Prometheus-fed timelines
    per_target = {(x.rule, x.target) for x in report.findings if not x.target.startswith("fleet/")}
    assert any(t in (addr["long-queue"], addr["kv-full"]) for _r, t in per_target), per_target


def test_cli_json_and_text(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, reps = replicas
    base = [*DIAGNOSE, "--once", "--prometheus", prom.url, "--range", "60s", "--step", "1s", "--rate-window", "5s"]
    p = subprocess.run([*base, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout.startswith("{"), p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert len(doc["signals"]) == 4 and len(doc["fleet"]["targets"]) == 4
    assert doc["fleet"]["summary"]["spellings"] == {"sglang:": 3, "sglang_": 1}
    assert doc["fleet"]["summary"]["pool_tokens"] == 3 * 65536 + 2048
    worst = [t["target"] for t in doc["fleet"]["targets"][:2]]
    assert set(worst) == {reps["long-queue"].address, reps["kv-full"].address}
    assert any(f["rule"] == "replica_imbalance" for f in doc["findings"])
    t = subprocess.run([*base, "--format", "text"], capture_output=True, text=True, timeout=120)
    out = t.stdout
    assert out.index("Fleet summary") < out.index("Worst targets") < out.index("top cause:"), out  # then each target, its top cause first
    assert "4 targets: 2 saturated" in out


def test_selector_without_sglang_series_lists_jobs(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, _ = replicas
    p = subprocess.run([*DIAGNOSE, "--once", "--prometheus", prom.url, "--selector", '{job="other"}'], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in p.stderr
    assert 'The selector {job="other"} matches no SGLang series' in err[0]
    assert "Jobs with SGLang series: sglang, sglang-us" in err[0] and "Other jobs: other" in err[0]


def test_unreachable_and_bad_query_are_one_line(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    prom, _ = replicas
    port = free_port()
    p = subprocess.run([*DIAGNOSE, "--once", "--prometheus", f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"diagnose: Prometheus at http://127.0.0.1:{port} is unreachable (connection refused) for /api/v1/series "
                           '`{__name__=~"sglang[:_](num_running_reqs|')
    assert line.endswith("…`; check the --prometheus URL and that the server is up.")
    # a selector Prometheus itself rejects (a bad regex): the real 400 bad_data answer, one line
    p = subprocess.run([*DIAGNOSE, "--once", "--prometheus", prom.url, "--selector", '{job=~"("}'], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert "\n" not in line and "answered HTTP 400 to /api/v1/series" in line and "bad_data" in line and "check --selector" in line


# -- (a2) a Prometheus with about 10 s of history --------------------------------------------------
@pytest.fixture(scope="module")
def young(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, dict[str, ReplayReplica]]]:
    """Two replicas (one saturated, one idle) scraped every second by a Prometheus that has just started:
    the whole history is about ten seconds."""
    need_prometheus()
    reps = {"busy": ReplayReplica(RUNS / "long-queue", 2, 60), "idle": ReplayReplica(RUNS / "client-bound-low-occupancy", 3, 60)}
    cfg = scrape_config({"sglang": [r.address for r in reps.values()]}, interval="1s")
    prom = start_prometheus(tmp_path_factory.mktemp("prom-young"), cfg)
    try:
        wait_for_samples(prom.url, '{__name__=~"sglang[:_]num_running_reqs"}', 2, 10)
        yield prom, reps
    finally:
        prom.stop()
        for r in reps.values():
            r.close()


def test_ten_seconds_of_history_names_the_saturated_replica(young: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    """`diagnose --once --prometheus URL` with the defaults: the step follows the scrape interval (1 s)
    and the range the history there is, so the saturated replica is named from ~10 s of data."""
    prom, reps = young
    p = subprocess.run([*DIAGNOSE, "--once", "--prometheus", prom.url, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout.startswith("{"), p.stderr[-3000:]
    doc = json.loads(p.stdout)
    rng = doc["fleet"]["source"]["range"]
    assert rng["scrape_interval_s"] == pytest.approx(1.0, abs=0.2) and rng["step_s"] <= 2
    assert 8 <= rng["history_s"] <= 60 and set(rng["from_data"]) == {"range", "step", "rate_window"}
    imb = [f for f in doc["findings"] if f["rule"] == "replica_imbalance"]
    assert len(imb) == 1, [(f["rule"], f["summary"][:80]) for f in doc["findings"]]
    busy_part, room_part = imb[0]["summary"].split(" while ", 1)
    assert reps["busy"].address in busy_part and reps["idle"].address in room_part
    assert reps["idle"].address not in busy_part
    # the per-target rules see the saturated replica's queue too
    assert any(f["rule"] == "queue_buildup" and f["target"] == reps["busy"].address for f in doc["findings"])


def test_one_sample_per_replica_is_enough_at_low_confidence(young: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    """A fixed 30 s step over a 10 min range gives each replica a single point: still named, at low confidence."""
    prom, reps = young
    col = collect_prometheus(ns(prom.url, range=600.0, step=30.0, rate_window=60.0), get_adapter())
    assert {len(tl.get("running_reqs") or []) for tl in col.timelines} == {1}
    report = evaluate(col.timelines, get_adapter())
    imb = [f for f in report.findings if f.rule == "replica_imbalance"]
    assert len(imb) == 1 and imb[0].confidence == "low" and imb[0].basis["readings"] == 1
    assert reps["busy"].address in imb[0].summary.split(" while ")[0]
    assert any("1 sample(s) per replica" in n for n in imb[0].notes)


# -- (b) 1,000 backfilled targets -------------------------------------------------------------------
@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, FleetSpec]]:
    need_prometheus()
    prom, spec = fleet_prometheus(tmp_path_factory.mktemp("prom-fleet"), 1000)
    try:
        yield prom, spec
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def big_collection(big: tuple[Prom, FleetSpec]) -> Any:
    prom, spec = big
    return collect_prometheus(ns(prom.url, selector='{job="sglang"}', range=600.0, step=None, rate_window=None, end=spec.end), get_adapter())


def test_backfilled_fleet_values(big: tuple[Prom, FleetSpec], big_collection: Any) -> None:
    _, spec = big
    col = big_collection
    assert len(col.timelines) == 1000 and not col.fleet["failed_queries"] and col.inputs[0].errors == 0
    tls = {tl.target: tl for tl in col.timelines}
    spell = [tl.meta["spelling"][0] for tl in col.timelines]
    assert spell.count("sglang:") == 500 and spell.count("sglang_") == 500
    for i in (0, 1, 3, 600, 601, 999):
        tl = tls[spec.instance(i)]
        want = spec.targets[i]
        assert tl.meta["labels"] == {"job": "sglang", "instance": spec.instance(i), "model_name": spec.model(i)}
        assert tl.stats("running_reqs")["mean"] == pytest.approx(want["running_mean"], abs=0.6)
        assert tl.stats("queue_reqs")["mean"] == pytest.approx(want["queue_mean"], abs=1.0)
        # rate() server-side (median: the first steps' windows reach before the first sample)
        assert tl.stats("request_rate")["p50"] == pytest.approx(want["rate"], rel=0.01)
        assert tl.stats("output_tps")["p50"] == pytest.approx(100 * float(want["rate"]), rel=0.01)
        hit = float(want["ttft_bucket"])
        buckets = [(b, 0.0 if b < hit else 1.0) for b in TTFT_BUCKETS] + [(float("inf"), 1.0)]
        assert tl.stats("ttft_seconds_p95")["max"] == pytest.approx(M.histogram_quantile(0.95, buckets), abs=1e-6)
        assert tl.stats("ttft_seconds_p50")["max"] == pytest.approx(M.histogram_quantile(0.5, buckets), abs=1e-6)
        assert tl.cfg("max_total_tokens") == (200_000 if i < 600 else 80_000)
        assert tl.version == ">=0.5.23"
    old = tls[spec.instance(610)]
    assert old.version == ">=0.4.4,<=0.4.9" and old.cfg("max_total_tokens") is None


def test_backfilled_fleet_rules_and_report(big: tuple[Prom, FleetSpec], big_collection: Any) -> None:
    _, spec = big
    col = big_collection
    report = evaluate(col.timelines, get_adapter())
    assert not report.errors, report.errors
    imb = {f.target: f for f in report.findings if f.rule == "replica_imbalance"}
    assert set(imb) == {"fleet/llama-70b", "fleet/qwen-7b"}
    for model, want in (("llama-70b", {3, 11, 19, 27}), ("qwen-7b", {600, 601})):
        f = imb[f"fleet/{model}"]
        hot = {e.signal.split("[")[1].rstrip("]") for e in f.evidence if e.signal.startswith("queue_reqs") and str(e.threshold).startswith(">=")}
        assert hot == {spec.instance(i) for i in want}
        assert f"load is concentrated on {len(want)} of" in f.summary
    drift = [f for f in report.findings if f.rule == "config_drift"]
    version = next(f for f in drift if f.target == "fleet/qwen-7b")
    assert "2 on SGLang >=0.4.4,<=0.4.9" in version.summary
    assert {e.signal for e in version.evidence} == {f"version [{spec.instance(i)}]" for i in spec.old_version}
    page = next(f for f in drift if f.target == spec.instance(spec.odd_page))
    s = page.suggestions[0]
    assert (s.flag, s.current, s.proposed) == ("--page-size", 16, 1)
    assert len(drift) == 2  # nothing else drifts
    doc = build(col, report)
    summ = doc["fleet"]["summary"]
    assert summ["targets"] == 1000 and summ["pool_tokens"] == 600 * 200_000 + 398 * 80_000
    assert summ["states"]["saturated"] == 6
    assert summ["models"]["llama-70b"]["queue_reqs"] == pytest.approx(4 * 31, abs=4)
    assert [t["target"] for t in doc["fleet"]["targets"][:6]] and all(
        t["state"] == "saturated" for t in doc["fleet"]["targets"][:6])
    assert len(doc["signals"]) == 1000


def test_partial_answer_reports_missing_signals(big: tuple[Prom, FleetSpec], tmp_path: Path) -> None:
    """A real partial failure: a Prometheus whose --query.max-samples refuses the bucket queries (the bare bucket
    rates, 84,000 points at 1,000 targets, and then each quantile query asked of it instead)."""
    prom, spec = big
    data = Path(str(prom.extra.get("data_dir", ""))) if prom.extra.get("data_dir") else prom.workdir / "data"
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head", "queries.active"))
    small = start_prometheus(tmp_path / "p", scrape_config({}), data_dir=copy, extra_args=("--query.max-samples=50000",))
    try:
        col = collect_prometheus(ns(small.url, range=600.0, step=None, rate_window=None, end=spec.end), get_adapter())
    finally:
        small.stop()
    assert set(col.fleet["failed_queries"]) == {"ttft_seconds_p50", "ttft_seconds_p95"}
    msgs = col.inputs[0].messages
    assert any(m.startswith("ttft_seconds_p95 is missing for all 1000 targets") and "HTTP 422" in m and "too many samples" in m for m in msgs)
    tl = col.timelines[0]
    assert tl.meta["missing_signals"] == ["ttft_seconds_p50", "ttft_seconds_p95"]
    assert tl.get("running_reqs") is not None and len(col.timelines) == 1000
    report = evaluate(col.timelines, get_adapter())
    assert any(f.rule == "replica_imbalance" for f in report.findings)


def test_watch_mode_reads_the_fleet(replicas: tuple[Prom, dict[str, ReplayReplica]]) -> None:
    import signal
    import time

    prom, reps = replicas
    p = subprocess.Popen([*DIAGNOSE, "--prometheus", prom.url, "--range", "60s", "--step", "1s", "--rate-window", "5s", "--interval", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert reps["long-queue"].address in out and "replica_imbalance" in out, out[-3000:]
    assert p.returncode == 1
