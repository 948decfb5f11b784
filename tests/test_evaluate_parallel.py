"""The target rules split over worker processes (diagnoser/forkmap.py) give the report of one process.

Every real recording in tests/data (SGLang and vLLM, their logs and their scrapes, each a timeline of its
own) is judged at once by the auto adapter, in one process and split over three: the findings, the
``checked`` list, the errors and the refused suggestions are the same, in the same order. A worker that
fails has its share judged in the parent: the same report again.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from diagnoser import forkmap
from diagnoser.collect import collect_logs, finalize
from diagnoser.engines import get_adapter
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.evaluate import evaluate
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA

RUNS = sorted(p.parent for p in DATA.glob("**/metrics") if p.is_dir() and (p.parent / "server.log").is_file())


def _scrapes(run: Path, adapter: Any) -> Timeline:
    tl = Timeline(target=f"{run.relative_to(DATA)} scrapes")
    mt = MetricsTarget("http://127.0.0.1:30000", adapter)
    files = sorted((run / "metrics").glob("*.prom"), key=lambda f: float(re.findall(r"_(\d+\.\d+)\.prom$", f.name)[0]))
    for f in files:
        mt.ingest_text(f.read_text(), float(re.findall(r"_(\d+\.\d+)\.prom$", f.name)[0]), tl)
    vr = VersionRange()
    vr.merge(mt.state.version)
    finalize(tl, vr)
    return tl


@pytest.fixture(scope="module")
def timelines() -> list[Timeline]:
    assert len(RUNS) >= 10, RUNS
    adapter = get_adapter("auto")
    out: list[Timeline] = []
    for run in RUNS:
        col = collect_logs(adapter, [str(run / "server.log")], target=f"{run.relative_to(DATA)} log")
        out.extend(col.timelines)
        out.append(_scrapes(run, adapter))
    return out


def _report(timelines: list[Timeline], workers: int) -> tuple[Any, ...]:
    rep = evaluate(timelines, get_adapter("auto"), workers=workers)
    return [f.to_dict() for f in rep.findings], rep.checked, [e.to_dict() for e in rep.errors], rep.dropped


def test_split_over_workers_gives_the_one_process_report(timelines: list[Timeline], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkmap, "stats", forkmap.Stats())
    one = _report(timelines, 1)
    three = _report(timelines, 3)
    assert forkmap.stats.forked == 2 and forkmap.stats.fell_back == 0
    assert len(one[0]) > 20 and {c["status"] for c in one[1]} >= {"fired", "fine", "not_judged"}
    assert three == one


def test_a_failed_worker_still_gives_the_one_process_report(timelines: list[Timeline], monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnoser.evaluate as E

    parent = os.getpid()
    real = E._judge

    def flaky(*args: Any) -> Any:
        if os.getpid() != parent:
            raise MemoryError("the worker ran out")
        time.sleep(0.02)  # (this process slower: the worker takes a chunk before this one has taken them all)
        return real(*args)

    one = _report(timelines, 1)
    monkeypatch.setattr(E, "_judge", flaky)
    monkeypatch.setattr(forkmap, "stats", forkmap.Stats())
    assert _report(timelines, 2) == one
    assert forkmap.stats.fell_back == 1 and "MemoryError: the worker ran out" in forkmap.last_problem()
