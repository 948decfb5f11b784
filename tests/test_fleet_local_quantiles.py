"""Quantiles computed from bucket rates (diagnoser/fleet/quantiles.py) are the floats a REAL Prometheus answers.

- Unit: the vectorised ``bucketQuantile`` equals the scalar one on seeded random bucket counts (monotonic or
  not, zero observations, bounds at or below 0); ``parse_le`` takes what Go's ``ParseFloat`` reads alike and
  declines the rest; ``quantile_rows`` declines what it does not handle and never raises on hostile rows.
- Real Prometheus (Debian package), against ``histogram_quantile(q, sum by (le, job, instance, model_name,
  name) (rate(…_bucket[w])))`` sent to it: (a) a generated fleet of odd histograms backfilled with promtool
  (idle, non-monotonic counts, two series per bucket, no ``+Inf`` bucket, bounds at and below 0, buckets that
  appear or stop within the range, a counter reset, everything in ``+Inf``, the pre-release ``name`` label)
  at quantiles 0 to 1; (b) the real SGLang 0.5.23 CPU recording of tests/test_fleet_quantile_bounds.py
  (TTFT, ITL, e2e and queue-time buckets as the engine exported them) at the plan's own quantiles. Every
  point must be the same float (NaN where Prometheus answers NaN), at the same times, for the same label sets.
Skips loudly without the binaries; fails under CI=true.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from diagnoser.fleet import quantiles as QQ
from diagnoser.fleet import queries as Q
from tests.fleet_fixtures import Prom, backfill, need_prometheus, scrape_config, start_prometheus
from tests.test_fleet_quantile_bounds import backfilled  # noqa: F401  (the module fixture: the real recording)

BASE = "time_to_first_token_seconds"
INF = float("inf")


# -- unit --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_dense_quantiles_equal_the_scalar_bucket_quantile(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nb = int(rng.integers(2, 12))
    finite = np.sort(rng.choice(np.arange(-3, 60) * 0.25, nb - 1, replace=False))
    bounds = np.append(finite, INF)
    c = rng.choice([0.0, 0.5, 1.0, 2.0, 3.5, 7.0, 0.1], (300, nb))
    if seed % 2:
        c = np.cumsum(c, axis=1)  # a valid histogram; the others are not monotonic
    c[::17] = 0.0  # no observation
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0, 1.5, -0.5, math.nan):
        got = QQ._quantiles_dense(q, bounds, c)
        want = [QQ.bucket_quantile(q, list(zip(bounds.tolist(), row.tolist(), strict=True))) for row in c]
        assert repr(got.tolist()) == repr(want), (seed, q)


def test_parse_le_reads_what_go_reads_and_declines_the_rest() -> None:
    for text, want in (("0.1", 0.1), ("+Inf", INF), ("-Inf", -INF), ("inf", INF), ("1e3", 1000.0), ("-0.5", -0.5), (".5", 0.5),
                       ("5.", 5.0), ("10", 10.0), ("0", 0.0), ("+1.5E-2", 0.015)):
        assert QQ.parse_le(text) == want, text
    for text in ("NaN", "1_0", "0x1p-2", " 1", "1 ", "", "abc", "1e400", "1e-400", None, 1.0):
        assert QQ.parse_le(text) is None, text


def _row(le: str, vals: list[float], **labels: str) -> dict[str, Any]:
    return {"metric": {"job": "j", "instance": "i", "model_name": "m", **labels, "le": le},
            "values": [[1000 + 60 * k, f"{v}"] for k, v in enumerate(vals)]}


PLAIN = [_row("1", [1, 2]), _row("2", [3, 4]), _row("+Inf", [5, 6])]


def test_quantile_rows_declines_what_it_does_not_handle() -> None:
    assert QQ.quantile_rows(PLAIN, (0.5,)) is not None
    declined = {
        "hex bound": PLAIN + [_row("0x10", [1, 1])],
        "two spellings of a bound": PLAIN + [_row("1.0", [1, 1], instance="k")],
        "no le": PLAIN + [{"metric": {"job": "j"}, "values": [[1000, "1"]]}],
        "NaN rate": PLAIN + [_row("3", [float("nan"), 1])],
        "three series to add": PLAIN + [_row("1", [1, 1], tp_rank="1"), _row("1", [1, 1], tp_rank="2")],
        "a label that is not a string": PLAIN + [{"metric": {"job": 3, "le": "1"}, "values": [[1000, "1"]]}],
        "values not a list": PLAIN + [{"metric": {"le": "1"}, "values": "x"}],
        "a result that is not a dict": [*PLAIN, 5],
    }
    for case, rows in declined.items():
        assert QQ.quantile_rows(rows, (0.5,)) is None, case
    assert QQ.quantile_rows([], (0.5, 0.95)) == {0.5: [], 0.95: []}


def test_quantile_rows_is_total_on_hostile_rows() -> None:
    rng = np.random.default_rng(7)
    junk: list[Any] = [None, 1, "x", [], {}, {"metric": None}, {"metric": {}, "values": [[1]]}, {"metric": {"le": "1"}, "values": [["a", "b"]]},
                       {"metric": {"le": "+Inf"}, "values": [[1e309, "1"]]}, {"metric": {"le": "1"}, "values": [[1, "1"], [1, "2"]]}]
    for _ in range(300):
        rows = [junk[int(i)] for i in rng.integers(0, len(junk), int(rng.integers(1, 5)))] + PLAIN[: int(rng.integers(0, 3))]
        got = QQ.quantile_rows(rows, (0.5,))
        assert got is None or isinstance(got[0.5], list)


# -- against a real Prometheus ---------------------------------------------------------------------------
STEP = 15
MINUTES = 10
BOUNDS = ("0.1", "0.5", "1", "2.5", "5", "10", "+Inf")


def _odd_histograms(end: float) -> list[tuple[dict[str, str], str, list[float | None]]]:
    """(labels, le, cumulative count per scrape or None where the series has no sample) for each series."""
    n = MINUTES * 60 // STEP + 1
    rng = np.random.default_rng(26)
    out: list[tuple[dict[str, str], str, list[float | None]]] = []

    def hist(inst: str, per_bucket: list[float], bounds: tuple[str, ...] = BOUNDS, extra: dict[str, str] | None = None,
             live: tuple[int, int] = (0, n), label: str = "model_name", job: str = "q") -> None:
        labels = {"job": job, "instance": inst, label: "m", **(extra or {})}
        counts = np.zeros(len(bounds))
        series: list[list[float | None]] = [[] for _ in bounds]
        for k in range(n):
            counts = counts + np.maximum(0, np.array(per_bucket) * rng.uniform(0.2, 1.8, len(bounds)))
            cum = np.cumsum(counts)
            for j in range(len(bounds)):
                series[j].append(round(float(cum[j]), 1) if live[0] <= k < live[1] else None)
        for j, le in enumerate(bounds):
            out.append((labels, le, series[j]))

    hist("plain", [1, 3, 4, 2, 1, 0.5, 0.2])
    hist("idle", [0, 0, 0, 0, 0, 0, 0])
    hist("every-bucket-rounded", [5, 0, 0, 3, 0, 0, 1])
    hist("two-series-a", [1, 2, 3, 1, 1, 0.5, 0.1], extra={"tp_rank": "0"})
    hist("two-series-a", [0.5, 2, 1, 1, 3, 0.5, 0.1], extra={"tp_rank": "1"})
    hist("no-inf", [1, 2, 3, 1, 1, 1], bounds=BOUNDS[:-1])
    hist("zero-and-below", [1, 2, 2, 1], bounds=("-1", "0", "1", "+Inf"))
    hist("only-inf", [3], bounds=("+Inf",))
    hist("all-in-inf", [0, 0, 0, 0, 0, 0, 4])
    hist("late", [1, 2, 1, 1, 1, 1, 1], live=(n // 2, n))
    hist("pre-release-name", [2, 1, 1, 1, 1, 1, 1], label="name")
    # a bucket series that stops half-way (the other buckets go on): group-steps without it
    hist("gap", [1, 2, 1, 1, 1, 1, 1])
    # job q2: a bound written twice ("1", "1.0"), which Prometheus coalesces: computed by Prometheus instead
    hist("spelled-twice", [1, 2, 1, 1, 1], bounds=("0.5", "1", "1.0", "5", "+Inf"), job="q2")
    hist("plain-2", [1, 3, 4, 2, 1, 0.5, 0.2], job="q2")
    gap = next(i for i, s in enumerate(out) if s[0]["instance"] == "gap" and s[1] == "2.5")
    out[gap] = (out[gap][0], "2.5", [v if k < n // 2 else None for k, v in enumerate(out[gap][2])])
    # non-monotonic across buckets (an invalid histogram Prometheus still answers for)
    labels = {"job": "q", "instance": "non-monotonic", "model_name": "m"}
    for j, le in enumerate(BOUNDS):
        rate = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0][j]
        out.append((labels, le, [round(rate * k * (1 + 0.1 * (k % 3)), 1) for k in range(n)]))
    # a counter reset in every bucket a third of the way
    labels = {"job": "q", "instance": "reset", "model_name": "m"}
    for j, le in enumerate(BOUNDS):
        out.append((labels, le, [float((k % (n // 3)) * (j + 1)) for k in range(n)]))
    return out


def _openmetrics(path: Path, end: float) -> None:
    n = MINUTES * 60 // STEP + 1
    times = [end - (n - 1 - k) * STEP for k in range(n)]
    with path.open("w") as fh:
        fh.write(f"# TYPE sglang:{BASE}_bucket unknown\n")
        targets = {}
        for labels, le, vals in _odd_histograms(end):
            text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "le": le}.items()))
            targets[labels["job"], labels["instance"]] = labels
            for t, v in zip(times, vals, strict=True):
                if v is not None:
                    fh.write(f"sglang:{BASE}_bucket{{{text}}} {v} {t:.3f}\n")
        for gauge in ("num_running_reqs", "num_queue_reqs"):  # what makes a target (series discovery)
            fh.write(f"# TYPE sglang:{gauge} gauge\n")
            for (job, inst), labels in sorted(targets.items()):
                name = "name" if "name" in labels else "model_name"
                for k, t in enumerate(times):
                    fh.write(f'sglang:{gauge}{{instance="{inst}",job="{job}",{name}="m"}} {k % 3} {t:.3f}\n')
        fh.write("# EOF\n")


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, float]]:
    need_prometheus()
    work = tmp_path_factory.mktemp("prom-odd-histograms")
    end = float(int(time.time()) - 60)
    _openmetrics(work / "odd.om", end)
    backfill(work / "odd.om", work / "data")
    prom = start_prometheus(work, scrape_config({}), data_dir=work / "data")
    try:
        yield prom, end
    finally:
        prom.stop()


def _ask(url: str, query: str, start: float, end: float, step: float) -> list[Any]:
    r = httpx.post(url + "/api/v1/query_range", data={"query": query, "start": start, "end": end, "step": step}, timeout=60).json()
    assert r["status"] == "success", r
    return r["data"]["result"]  # type: ignore[no-any-return]


def _by_labels(rows: list[Any]) -> dict[str, str]:
    return {json.dumps(r["metric"], sort_keys=True): repr([(float(t), float(v)) for t, v in r["values"]]) for r in rows}


def _compare(url: str, base: str, matchers: str, qs: tuple[float, ...], start: float, end: float, step: float, window: str) -> int:
    sel = Q.name_selector([base], matchers, "_bucket")
    rates = _ask(url, f"rate({sel}[{window}])", start, end, step)
    mine = QQ.quantile_rows(rates, qs)
    assert mine is not None, f"{base}: declined"
    points = 0
    for q in qs:
        theirs = _ask(url, f"histogram_quantile({q:g}, sum by ({Q.HIST_GROUP}) (rate({sel}[{window}])))", start, end, step)
        a, b = _by_labels(theirs), _by_labels(mine[q])
        assert sorted(a) == sorted(b), (base, q)
        for k in a:
            assert a[k] == b[k], (base, q, k)
        points += sum(len(r["values"]) for r in theirs)
    return points


def test_odd_histograms_give_prometheus_own_floats(odd: tuple[Prom, float]) -> None:
    prom, end = odd
    qs = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0)
    for step, window in ((60.0, "60s"), (15.0, "45s"), (120.0, "120s")):
        points = _compare(prom.url, BASE, 'job="q"', qs, end - MINUTES * 60, end, step, window)
        assert points > 100
    # NaN points are answered (idle, no +Inf bucket) and the gap's half-way steps took the per-step path
    sel = Q.name_selector([BASE], 'job="q"', "_bucket")
    rows = QQ.quantile_rows(_ask(prom.url, f"rate({sel}[60s])", end - 600, end, 60.0), (0.5,))
    assert rows is not None
    by_inst = {r["metric"].get("instance"): [v for _t, v in r["values"]] for r in rows[0.5]}
    assert all(math.isnan(v) for v in by_inst["idle"]) and all(math.isnan(v) for v in by_inst["no-inf"])
    assert by_inst["all-in-inf"] and all(v == 10.0 for v in by_inst["all-in-inf"])


def test_the_real_recording_gives_prometheus_own_floats(backfilled: tuple[Prom, float, dict[str, set[str]]]) -> None:  # noqa: F811
    prom, end, _les = backfilled
    bases = {sq.base: sq for sq in Q.plan("", 2.0, 10.0) if sq.kind == "quantile"}
    total = 0
    for base in bases:
        qs = tuple(sorted({sq.q for sq in Q.plan("", 2.0, 10.0) if sq.base == base}))
        total += _compare(prom.url, base, "", qs, end - 110, end + 1, 10.0, "10s")
    assert total > 40  # TTFT, ITL, e2e and queue time each answered


def _pass(url: str, end: float, sel: str, local: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    from diagnoser.engines import get_adapter
    from diagnoser.evaluate import evaluate
    from diagnoser.fleet import collect_prometheus
    from diagnoser.fleet import source as S
    from diagnoser.outputs.report import build

    monkeypatch.setattr(S, "_LOCAL_QUANTILES", local)
    args = argparse.Namespace(prometheus=url, selector=sel, range=600.0, step=None, rate_window=None, end=end, timeout=20.0,
                              bearer_token=None, basic_auth=None, header=[])
    col = collect_prometheus(args, get_adapter())
    doc = build(col, evaluate(col.timelines, get_adapter()))
    series = {tl.target: {f"{k[0]}/{k[1]}": repr((s.ts.tolist(), s.values.tolist(), s.sources.tolist())) for k, s in tl.series.items()}
              for tl in col.timelines}
    rest = {k: v for k, v in doc.items() if k not in ("fleet", "inputs")}
    return col, json.dumps([series, rest, col.fleet["dropped"], col.fleet["failed_queries"]], sort_keys=True, default=str)


def test_a_pass_is_the_same_with_the_quantiles_computed_here_or_by_prometheus(odd: tuple[Prom, float], monkeypatch: pytest.MonkeyPatch) -> None:
    prom, end = odd
    for sel, computed_here in (('{job="q"}', True), ('{job=~"q|q2"}', False)):  # q2: asked of Prometheus after all
        col_l, doc_l = _pass(prom.url, end, sel, True, monkeypatch)
        col_r, doc_r = _pass(prom.url, end, sel, False, monkeypatch)
        assert len(col_l.timelines) == len(col_r.timelines) >= 12
        assert any(("ttft_seconds_p95", "") in tl.series for tl in col_l.timelines)
        assert doc_l == doc_r, sel
        extra = col_l.fleet["queries"] - col_r.fleet["queries"]
        plan = Q.plan("", 15.0, 60.0)
        jobs = len(Q.bucket_rates(plan, "", 60.0))
        quantile_queries = sum(1 for q in plan if q.kind == "quantile")
        # here: one rate query per histogram instead of one per quantile; q2: those, then TTFT's two asked again
        assert extra == (jobs - quantile_queries if computed_here else jobs - quantile_queries + 2), (sel, extra)
