"""Reservation-bound admission read from a real run (issue 25's second bullet): the pool, not a prefill stall.

tests/data/sglang-cpu-issue25/reservation-bound (its README gives the run): the real SGLang 0.5.23 CPU engine,
the 94M random Llama, ``--max-total-tokens 4096``, 48 clients with ignore_eos and 256-512 new tokens. About 8
run and 40 wait while the usage reads 0.34-0.81: each running request reserves its remaining output
(``PrefillAdder``, schedule_policy.py at v0.5.23). Read from its log, from its scrapes and server info (what
``--url`` sees) and as a replay, the admission model must call the waiting readings KV (by the reservation
arithmetic), the top cause must be the pool, no input may propose lowering ``--schedule-conservativeness``,
and the first fix must grow the pool within what the demand seen needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli.run import analyse, build_parser
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.replay import collect_replay
from diagnoser.rules.admission import admission
from diagnoser.rules.base import RuleContext, next_pow2
from tests.conftest import DATA

ADAPTER = get_adapter("sglang")
RUN = DATA / "sglang-cpu-issue25" / "reservation-bound"
POOL = {"kv_saturation", "kv_pool_too_small"}


def _collect(how: str, tmp: Path) -> Any:
    if how == "log":
        return collect_logs(ADAPTER, [str(RUN / "server.log")])
    if how == "scrapes":
        dst = tmp / RUN.name
        shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("server.log", "*.log"))
        return collect_replay(str(dst), ADAPTER)
    return collect_replay(str(RUN), ADAPTER)


@pytest.fixture(scope="module", params=["log", "scrapes", "replay"])
def judged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, dict[str, Any]]:
    col = _collect(request.param, tmp_path_factory.mktemp("reservation"))
    _report, doc = analyse(build_parser().parse_args(["--once", "--log", "-"]), col, ADAPTER)
    return request.param, col, doc


def test_the_waiting_readings_are_held_by_the_kv_reservation(judged: tuple[str, Any, dict[str, Any]]) -> None:
    how, col, _doc = judged
    a = admission(RuleContext(col.timelines[0], {}, ADAPTER, None, {}, {}))
    top, share = a.top()
    shares = {c: round(a.share(c), 2) for c in ("slots", "kv", "budget", "none")}
    assert top == "kv" and share >= 0.5, (how, top, shares)
    assert a.kv_how == "arithmetic", (how, a.kv_how)  # the reservation arithmetic, not the usage threshold
    assert a.share("slots") == 0 and a.share("budget") == 0, (how, shares)  # 2,048 slots, a 4,096-token chunk
    # the usage never reached the fallback threshold: the classification cannot have come from it
    assert float(max(u for u in a.usage.tolist() if u == u)) < 0.95


def test_the_top_cause_is_the_pool_and_nothing_lowers_conservativeness(judged: tuple[str, Any, dict[str, Any]]) -> None:
    how, _col, doc = judged
    top = next(iter(doc["top"].values()))
    assert top["rule"] in POOL and top["severity"] in ("warning", "critical"), (how, top["rule"])
    assert top["rule"] != "prefill_stall"
    for f in doc["findings"]:
        for s in f["suggestions"]:
            if s["flag"] == "--schedule-conservativeness":
                assert not (isinstance(s["proposed"], int | float) and isinstance(s["current"], int | float)
                            and s["proposed"] < s["current"]), (how, f["rule"], s)
    stall = [f for f in doc["findings"] if f["rule"] == "prefill_stall"]
    assert all(f["severity"] not in ("warning", "critical") for f in stall), (how, [f["summary"] for f in stall])


def test_the_first_fix_grows_the_pool_within_the_demand(judged: tuple[str, Any, dict[str, Any]]) -> None:
    """Bounded: above the 4,096-token pool and at most the next power of two above what every request in
    flight (running + waiting, median) needs at its full length with a quarter of headroom."""
    how, col, doc = judged
    s = next(iter(doc["top"].values()))["suggestion"]
    assert s["flag"] == "--max-total-tokens" and s["current"] == 4096, (how, s)
    a = admission(RuleContext(col.timelines[0], {}, ADAPTER, None, {}, {}))
    full = a.full_length()
    assert full and 400 < full < 700, (how, full)  # prompts of 134-155 tokens + 256-512 new ones
    need = a.demand() * full * 1.25
    assert 4096 < s["proposed"] <= next_pow2(need), (how, s["proposed"], a.demand(), full)


def _early(tmp: Path, with_log: bool, with_scrapes: bool) -> Path:
    """The run's first 38 s (scrapes 1-19, the log up to 19:13:40): no request had finished yet, as in the
    issue's run, so the request sizes are not in the counters."""
    out = tmp / ("early-" + ("l" if with_log else "") + ("s" if with_scrapes else ""))
    (out / "metrics").mkdir(parents=True)
    if with_scrapes:
        for f in sorted((RUN / "metrics").glob("*.prom"))[:19]:
            shutil.copy(f, out / "metrics" / f.name)
        for f in RUN.glob("get_*.json"):
            shutil.copy(f, out / f.name)
    if with_log:
        lines = []
        for line in (RUN / "server.log").read_text().splitlines(keepends=True):
            if line.startswith("[2026-12-02 19:13:4"):
                break
            lines.append(line)
        (out / "server.log").write_text("".join(lines))
    return out


@pytest.mark.parametrize("how", ["log", "scrapes", "replay"])
def test_before_any_request_finished_the_pool_is_still_the_cause(how: str, tmp_path: Path) -> None:
    """The issue's regime: no request finished, so the sizes are estimated (log) or unknown (scrapes). The
    running count held at 8 below the 2,048 slots while 40 wait and no prefill budget binds is the reservation
    (inferred); the scrapes' running gauge read 1 for 20 s (the report beside the second prefill, while the
    decode counters counted 8 tokens per step), which is a report, not a running reading. Before issue 25's
    fix: prefill_stall with --schedule-conservativeness 1.0 -> 0.3 from the log, queue_buildup from the scrapes."""
    d = _early(tmp_path, how != "scrapes", how != "log")
    col = collect_logs(ADAPTER, [str(d / "server.log")]) if how == "log" else collect_replay(str(d), ADAPTER)
    a = admission(RuleContext(col.timelines[0], {}, ADAPTER, None, {}, {}))
    assert a.top()[0] == "kv" and a.kv_how == "inferred", (how, a.top(), a.kv_how)
    _report, doc = analyse(build_parser().parse_args(["--once", "--log", "-"]), col, ADAPTER)
    top = next(iter(doc["top"].values()))
    assert top["rule"] in POOL, (how, top["rule"], top["summary"])
    s = top["suggestion"]
    assert s["flag"] == "--max-total-tokens" and 4096 < s["proposed"] <= 65536, (how, s)
    for f in doc["findings"]:
        for sg in f["suggestions"]:
            assert sg["flag"] != "--schedule-conservativeness", (how, f["rule"], sg)
