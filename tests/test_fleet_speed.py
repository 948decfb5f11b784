"""The fleet pass's fast paths agree with their reference paths (issue 26: a pass over 10,000 targets).

- ``_values_batch`` (every series of an answer converted at once) against ``_values`` per series, on plain
  and hostile answers: where the batch takes an answer, the arrays are the same and the reference would
  have dropped nothing; where it declines, the caller takes the reference path.
- A whole pass over the 1,000 backfilled targets in a real Prometheus with the batch path on and off:
  the same timelines, findings and report.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from diagnoser.fleet import collect_prometheus
from diagnoser.fleet import source as S
from diagnoser.outputs.report import build
from tests.test_fleet_prometheus import big, ns  # noqa: F401  (the module fixture: 1,000 targets in a real Prometheus)


def _reference(lists: list[Any]) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    t = S._Targets()
    return [S._values(v, t) for v in lists], t.dropped


PLAIN = [[[1700000000 + 30 * j, f"{0.1 * j + i}"] for j in range(21)] for i in range(50)]
CASES: dict[str, list[Any]] = {
    "plain": PLAIN,
    "empty series among others": [PLAIN[0], [], PLAIN[1]],
    "one point each": [[[1.5, "2"]], [[3, "1e3"]], [[4, "-0"]]],
    "float and string times": [[[1700000000.5, "1"], ["1700000001", "2"]]],
    "NaN": [PLAIN[0], [[1, "NaN"], [2, "1"]]],
    "+Inf and 1e309": [[[1, "+Inf"], [2, "1e309"], [3, "-Inf"], [4, "2"]]],
    "junk value": [[[1, "abc"], [2, "1"]], PLAIN[0]],
    "short pair": [[[1], [2, "1"]]],
    "long pair": [[[1, "1", "x"], [2, "2", "y"]]],
    "a string as a pair": [["12", [3, "4"]]],
    "values not a list": [PLAIN[0], {"a": 1}, "1,2"],
    "None values": [None, PLAIN[0]],
    "out of order": [[[3, "1"], [1, "2"], [2, "3"]]],
    "order resets between series": [[[5, "1"], [6, "2"]], [[1, "1"], [2, "2"]]],
    "duplicate times": [[[1, "1"], [1, "2"], [2, "3"]]],
    "bool and null": [[[True, "1"], [2, None]]],
    "nested lists": [[[[1], "1"]]],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_values_equal_the_per_series_reference(case: str) -> None:
    lists = CASES[case]
    ref, dropped = _reference(lists)
    got = S._values_batch(lists)
    if got is None:  # declined: the caller takes the reference path, which counts what it drops
        return
    assert not dropped, f"the batch took an answer the reference drops from: {dropped}"
    assert len(got) == len(ref)
    for (gt, gv), (rt, rv) in zip(got, ref, strict=True):
        assert gt.dtype == rt.dtype == np.float64 and gv.dtype == rv.dtype == np.float64
        assert np.array_equal(gt, rt) and np.array_equal(gv, rv)


def test_batch_declines_what_the_reference_must_count() -> None:
    for case in ("NaN", "+Inf and 1e309", "junk value", "short pair", "values not a list", "out of order"):
        assert _reference(CASES[case])[1] or case in ("short pair", "out of order"), case
        assert S._values_batch(CASES[case]) is None, case
    assert S._values_batch(PLAIN) is not None and S._values_batch(CASES["order resets between series"]) is not None


def _pass(url: str, end: float, batch: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, str]:
    monkeypatch.setattr(S, "_BATCH", batch)
    col = collect_prometheus(ns(url, selector='{job="sglang"}', range=600.0, step=None, rate_window=None, end=end), get_adapter())
    report = evaluate(col.timelines, get_adapter())
    doc = build(col, report)
    fleet = {k: v for k, v in doc["fleet"].items() if k != "source"}  # (the source part holds the pass's timings)
    rest = {k: v for k, v in doc.items() if k not in ("fleet", "inputs")}
    return col, report, json.dumps([rest, fleet], sort_keys=True, default=str)


def test_fast_and_reference_pass_agree_on_the_backfilled_fleet(big: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    prom, spec = big
    col_f, rep_f, doc_f = _pass(prom.url, spec.end, True, monkeypatch)
    col_r, rep_r, doc_r = _pass(prom.url, spec.end, False, monkeypatch)
    assert len(col_f.timelines) == len(col_r.timelines) == 1000
    for a, b in zip(col_f.timelines, col_r.timelines, strict=True):
        assert a.target == b.target and sorted(a.series) == sorted(b.series)
        for key in a.series:
            sa, sb = a.series[key], b.series[key]
            assert np.array_equal(sa.ts, sb.ts) and np.array_equal(sa.values, sb.values, equal_nan=True)
            assert list(sa.sources) == list(sb.sources)
    assert [f.to_dict() for f in rep_f.findings] == [f.to_dict() for f in rep_r.findings]
    assert len(rep_f.findings) > 0
    assert doc_f == doc_r
    assert col_f.fleet["dropped"] == col_r.fleet["dropped"]
