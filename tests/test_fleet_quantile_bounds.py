"""Honest quantiles for every histogram on the ``--prometheus`` path, against a REAL Prometheus (issue 25).

The real SGLang 0.5.23 CPU run tests/data/sglang-cpu-issue25/reservation-bound (its README gives the run:
46 scrapes over 90 s, from idle, 40 requests waiting behind a 4,096-token pool) is converted to OpenMetrics
with the scrapes' own spacing and backfilled with ``promtool tsdb create-blocks-from openmetrics`` into the
Debian ``prometheus``, ending a minute ago. Its requests waited up to about 90 s, so Prometheus'
``histogram_quantile`` interpolates TTFT, e2e and queue-time quantiles inside wide buckets past the time since
the target was idle. Every quantile the fleet queries (TTFT, ITL, e2e, queue time) must then read as the
bucket's lower bound (``> N s``), the bounds being the ``le`` values Prometheus holds; no quantile point may
claim more than the clock allows. Skips loudly without the binaries; fails under CI=true.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.engines import get_adapter
from diagnoser.fleet import collect_prometheus
from diagnoser.fleet.bounds import idle_times
from diagnoser.floor import is_floor
from tests.conftest import DATA
from tests.fleet_fixtures import Prom, backfill, need_prometheus, scrape_config, start_prometheus

pytestmark = pytest.mark.prometheus
RUN = DATA / "sglang-cpu-issue25" / "reservation-bound"
INSTANCE = "replica-a:30000"
STEMS = ("ttft_seconds", "itl_seconds", "e2e_seconds", "queue_time_seconds")


def _scrape_time(f: Path) -> float:
    return float(re.findall(r"_(\d+\.\d+)\.prom$", f.name)[0])


def recording_openmetrics(run: Path, out: Path, end: float) -> tuple[float, dict[str, set[str]]]:
    """Write the run's scrapes as OpenMetrics (families grouped, each series in time order, ``# EOF``), shifted so
    the last scrape lands at ``end``; returns the shift and the ``le`` values of each histogram."""
    files = sorted((run / "metrics").glob("*.prom"), key=_scrape_time)
    shift = end - _scrape_time(files[-1])
    fams: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], list[tuple[float, list[tuple[str, dict[str, str], float]]]]]]] = {}
    les: dict[str, set[str]] = {}
    for f in files:
        t = _scrape_time(f) + shift
        for fam in text_string_to_metric_families(f.read_text()):
            if fam.type not in ("gauge", "counter", "histogram"):
                continue
            kind, series = fams.setdefault(fam.name, (fam.type, {}))
            by_key: dict[tuple[tuple[str, str], ...], list[tuple[str, dict[str, str], float]]] = {}
            for s in fam.samples:
                if s.name.endswith("_created") or s.value != s.value:
                    continue
                labels = dict(s.labels, job="sglang", instance=INSTANCE)
                key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                by_key.setdefault(key, []).append((s.name, labels, s.value))
                if s.name.endswith("_bucket"):
                    les.setdefault(fam.name.split(":", 1)[1], set()).add(labels["le"])
            for key, samples in by_key.items():
                series.setdefault(key, []).append((t, samples))
    with out.open("w") as fh:
        for name, (kind, series) in fams.items():
            fh.write(f"# TYPE {name} {kind}\n")
            for points in series.values():
                for t, samples in points:
                    for sname, labels, v in samples:
                        lab = ",".join(f'{k}="{val}"' for k, val in sorted(labels.items()))
                        fh.write(f"{sname}{{{lab}}} {v!r} {t:.3f}\n")
        fh.write("# EOF\n")
    return shift, les


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, float, dict[str, set[str]]]]:
    need_prometheus()
    work = tmp_path_factory.mktemp("prom-bounds")
    end = float(int(time.time()) - 60)
    om = work / "run.om"
    _shift, les = recording_openmetrics(RUN, om, end)
    backfill(om, work / "data")
    prom = start_prometheus(work, scrape_config({}), data_dir=work / "data")
    try:
        yield prom, end, les
    finally:
        prom.stop()


def _ns(url: str, end: float) -> argparse.Namespace:
    return argparse.Namespace(prometheus=url, selector="", range=110.0, step=2.0, rate_window=10.0, end=end + 1, timeout=20.0,
                              bearer_token=None, basic_auth=None, header=[])


def test_every_fleet_quantile_stays_within_its_buckets_and_the_clock(backfilled: tuple[Prom, float, dict[str, set[str]]]) -> None:
    prom, end, les = backfilled
    col = collect_prometheus(_ns(prom.url, end), get_adapter())
    assert [tl.target for tl in col.timelines] == [INSTANCE], [tl.target for tl in col.timelines]
    tl = col.timelines[0]
    idle = idle_times(tl)
    assert len(idle), "the run starts idle: its first scrapes read nothing running or waiting"
    floored: dict[str, int] = {}
    seen: set[str] = set()
    for (name, rank), s in tl.series.items():
        stem = name.rsplit("_p", 1)[0]
        if rank or stem not in STEMS or not re.fullmatch(r".+_p\d+", name):
            continue
        seen.add(stem)
        base = re.search(r"sglang:(\w+)\[", str(s.sources[0]))
        assert base, s.sources[0]
        bounds = {float(b) for b in les[base.group(1)] if b != "+Inf"}
        for t, v, src in zip(s.ts.tolist(), s.values.tolist(), s.sources.tolist(), strict=True):
            k = int(np.searchsorted(idle, t, "left")) - 1
            elapsed = t - float(idle[k]) if k >= 0 else None
            if is_floor(source=src):
                floored[stem] = floored.get(stem, 0) + 1
                assert v in bounds and "read from Prometheus" in src, (name, v, src)  # a bucket's lower bound, as Prometheus holds it
                continue
            if elapsed is not None and v == v:
                assert v <= elapsed + 1e-6, (name, t - end, v, elapsed, src)  # never more than the clock allows
    assert {"ttft_seconds", "e2e_seconds", "queue_time_seconds", "itl_seconds"} <= seen, seen
    # the run's long waits put quantiles of more than TTFT past the clock: they were bounded, not only TTFT's
    assert floored.get("ttft_seconds") and (floored.get("e2e_seconds") or floored.get("queue_time_seconds")), floored


def test_the_fleet_names_the_pool_as_the_direct_path_does(backfilled: tuple[Prom, float, dict[str, set[str]]]) -> None:
    """The same run through Prometheus: the top cause is the pool (as from its log, scrapes and replay,
    tests/rules/test_reservation_bound.py), not a prefill stall."""
    from diagnoser.evaluate import evaluate
    from diagnoser.model import Severity

    prom, end, _les = backfilled
    col = collect_prometheus(_ns(prom.url, end), get_adapter())
    report = evaluate(col.timelines, get_adapter())
    rules = [f.rule for f in report.findings if f.severity.value >= Severity.WARNING.value]
    assert rules and rules[0] in ("kv_saturation", "kv_pool_too_small"), [(f.rule, f.severity, f.summary[:80]) for f in report.findings]
    assert "prefill_stall" not in rules
