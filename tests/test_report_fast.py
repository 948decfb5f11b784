"""The report of a fleet, built fast, is the report built plainly: the same document to the bit.

:func:`diagnoser.outputs.report.signal_tables` summarises the series of one signal for all targets at once
(NumPy); :func:`build` passes the signal tables' numbers through the door without a walk, reuses them for
the fleet section, and redacts the rest without copying what stays as it is (``redact_owned``). Each is
compared here with the plain path it replaces (``signal_table`` per target, ``Timeline.stats``, one copying
``redact_strings`` walk over the whole document), on timelines made to hit every branch: NaN, infinities,
0.0 beside -0.0, lengths 1 to 70, ranks, window quantiles, lower-bound sources, the decode-token counter,
times that do not increase, keys written twice, planted secrets.
"""

from __future__ import annotations

import gc
import json
import math
import random
import types
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from diagnoser.engines import get_adapter
from diagnoser.evaluate import evaluate
from diagnoser.floor import Floor
from diagnoser.model import ConfigFact, Severity, iso
from diagnoser.outputs import report as R
from diagnoser.redact import redact, redact_strings
from diagnoser.timeline import Series, Timeline
from diagnoser.timeline.derived import window_rate
from tests.bitsame import same
from tests.test_fleet_unit import FakeProm, collect, matrix

T0 = 1_800_000_000.0
SRC = "prometheus@2027-01-15T08:00:00Z sglang:num_running_reqs"
FLOOR_SRC = "prometheus@2027-01-15T08:00:00Z ttft histogram (> 100 s: in the +Inf bucket)"


def _values(rng: random.Random, n: int, kind: str) -> list[float]:
    if kind == "const":
        return [rng.choice([0.0, 1.0, 0.3, 2e5, -4.25])] * n
    if kind == "ints":
        return [float(rng.randint(0, 64)) for _ in range(n)]
    if kind == "zeros":  # 0.0 and -0.0 (a sort keeps their order, min/max/quantiles read them)
        return [rng.choice([0.0, -0.0]) for _ in range(n)]
    if kind == "negzero":
        return [-0.0] * n
    if kind == "huge":  # b - a overflows; sums overflow
        return [rng.choice([1.7e308, -1.7e308, 1e300, 5.0]) for _ in range(n)]
    if kind == "nan":
        v = [rng.random() for _ in range(n)]
        v[rng.randrange(n)] = math.nan
        return v
    if kind == "inf":
        v = [rng.random() for _ in range(n)]
        v[rng.randrange(n)] = rng.choice([math.inf, -math.inf])
        return v
    if kind == "allnan":
        return [math.nan] * n
    return [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8) for _ in range(n)]


KINDS = ["rand"] * 8 + ["const", "ints", "zeros", "negzero", "huge", "nan", "inf", "allnan"]
NAMES = ["running_reqs", "queue_reqs", "token_usage", "gen_throughput_tps", "output_tps", "prompt_tps", "request_rate",
         "ttft_seconds_p95", "itl_seconds_p50", "zz_custom_signal"]


def fleet_timelines(seed: int, n: int = 80) -> list[Timeline]:
    """Fleet-like timelines (each signal's series on a time grid shared by all targets, as a range query
    gives; most targets with the same signals) with every case the fast path must hand to the plain one,
    or get right itself."""
    rng = random.Random(seed)
    grids = {k: Series(ts=[T0 + 30.0 * i for i in range(k)], values=[0.0] * k, sources=[SRC] * k) for k in (1, 2, 5, 21, 70)}
    floor_grid = Series(ts=[T0 + 30.0 * i for i in range(21)], values=[0.0] * 21, sources=[SRC] * 20 + [FLOOR_SRC])
    flat_t = Series(ts=[T0 + 30.0 * (i - (i > 5)) for i in range(21)], values=[0.0] * 21, sources=[SRC] * 21)  # an interval of 0 s
    tls = []
    for i in range(n):
        tl = Timeline(target=f"10.0.{i // 250}.{i % 250}:30000")
        odd = rng.random() < 0.15  # a target unlike the rest: its own plan
        length = rng.choice([5, 70, 2, 1]) if odd and rng.random() < 0.5 else 21
        for name in NAMES:
            if odd and rng.random() < 0.2:
                continue  # a signal some targets lack
            k = length if rng.random() < 0.95 else rng.choice([1, 2, 5, 21, 70])  # a length the others lack
            grid = grids[k]
            if name.endswith("_p95") and k == 21 and rng.random() < 0.2:
                grid = floor_grid
            if name in R.WINDOW_RATES and k == 21 and rng.random() < 0.1:
                grid = flat_t
            tl.series[(name, "")] = grid.with_values(_values(rng, len(grid), rng.choice(KINDS)))
        decoded = rng.random() < 0.15  # output_tps from the decode-token counter (two readings or more)
        tl.series[("decode_tokens", "")] = grids[21].with_values(_values(rng, 21, "ints")) if decoded else grids[1].with_values([1.0])
        if rng.random() < 0.05:
            tl.series[("queue_reqs", "")] = Series()  # an empty series
        if odd and rng.random() < 0.3:  # per-rank series
            for rank in ("dp0", "dp1"):
                tl.series[("running_reqs", rank)] = grids[21].with_values(_values(rng, 21, rng.choice(KINDS)))
        if odd and rng.random() < 0.2:  # "a[dp0]" twice: a bare name and a rank key
            tl.series[("running_reqs[dp0]", "")] = grids[21].with_values(_values(rng, 21, "rand"))
            tl.series[("running_reqs", "dp0")] = grids[21].with_values(_values(rng, 21, "rand"))
        if rng.random() < 0.05:
            tl.meta["window_quantiles"] = {"ttft_seconds_p95": Floor(100.0, 200.0), "itl_seconds_p50": 0.02}
        tls.append(tl)
    return tls


@pytest.mark.parametrize("seed", range(6))
def test_signal_tables_are_signal_table_of_each_target(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = fleet_timelines(seed)
    want = [R.signal_table(tl) for tl in tls]
    plain = {"summarize": 0, "window_rate": 0}

    def counting(name: str) -> Any:
        f = getattr(R, name)

        def counted(*a: Any) -> Any:
            plain[name] += 1
            return f(*a)
        return counted

    for name in plain:
        monkeypatch.setattr(R, name, counting(name))
    same(R.signal_tables(tls), want)
    # most series took the fast path (the rest: their own)
    assert 0 < plain["summarize"] < sum(map(len, want)) / 2 and 0 < plain["window_rate"] < len(tls) * len(R.WINDOW_RATES) / 2


def test_the_means_when_sum_compensates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.12's sum() is compensated: then the rows are summed by sum() itself."""
    tls = fleet_timelines(11)
    monkeypatch.setattr(R, "_SUM_IN_ORDER", False)
    same(R.signal_tables(tls), [R.signal_table(tl) for tl in tls])


def test_means_add_left_to_right_as_sum_does() -> None:
    rng = np.random.default_rng(3)
    m = rng.standard_normal((50, 37)) * 10.0 ** rng.integers(-12, 12, (50, 37))
    if R._SUM_IN_ORDER:
        assert R._means(m) == [sum(row) / 37 for row in m.tolist()]


def test_window_rates_of_rows_are_window_rate() -> None:
    """numpy's sums of rows are its sums of one row (pairwise, by blocks of 8 up to 128 and halves past):
    the batch rates are window_rate's at every length."""
    rng = np.random.default_rng(5)
    for n in [*range(2, 140), 255, 256, 257, 300]:
        ts = np.cumsum(rng.uniform(0.5, 60.0, n)) + T0
        grid = Series(ts=ts.tolist(), values=[0.0] * n, sources=[SRC] * n)
        tls = []
        for _ in range(9):
            tl = Timeline(target="t")
            tl.series[("prompt_tps", "")] = grid.with_values((rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).tolist())
            tls.append(tl)
        series = [tl.series[("prompt_tps", "")] for tl in tls]
        got = R._window_rates("prompt_tps", tls, np.array([s.values for s in series]), series)
        same(got, [window_rate(tl, "prompt_tps").value for tl in tls])


def test_quantiles_are_quantile() -> None:
    from diagnoser.timeline import quantile

    rng = np.random.default_rng(7)
    for n in range(1, 80):
        s = np.sort(rng.standard_normal((4, n)) * 1e3, axis=1)
        for q in (0.5, 0.95):
            same(R._quantiles(s, q), [float(quantile(row, q)) for row in s.tolist()])


def _old_config_table(tl: Timeline) -> dict[str, dict[str, Any]]:
    """config_table before the fleet speed work (db7a76d)."""
    return {k: redact({"value": v.value, "source": v.source}) if not k.startswith("arg.") else {"value": redact({k[4:]: v.value})[k[4:]], "source": v.source} for k, v in sorted(tl.config.items())}


def test_config_table_is_the_old_one() -> None:
    tl = Timeline(target="t")
    facts = {"max_total_tokens": 200000, "page_size": 1, "served_model_name": "llama", "arg.api_key": "sk-x-1",
             "arg.hf_token": {"nested": ["hf_x"]}, "arg.port": 30000, "arg.model_path": "http://u:pw-c@h/m", "dtype": None,
             "arg.token_capacity": 5, "launch": '{"api_key": "sk-json-2", "n": 1}', "ratio": 0.5, "flag": True,
             "arg.tokens": ["a", {"secret": "s"}], "list": [1, "Bearer abc.def"], "arg.": "x"}
    for k, v in facts.items():
        tl.config[k] = ConfigFact(v, "prometheus@2027-01-15T08:00:00Z token=src-3 " + k)
    same(R.config_table(tl), _old_config_table(tl))


def test_config_table_of_an_arg_whose_name_redaction_changes_does_not_raise() -> None:
    """The old table looked the value up under the redacted name (a KeyError); now it is the value."""
    tl = Timeline(target="t")
    tl.config["arg.u:pw@host"] = ConfigFact("v", "s")
    with pytest.raises(KeyError):
        _old_config_table(tl)
    assert R.config_table(tl) == {"arg.u:pw@host": {"value": "v", "source": "s"}}


def plain_build(collection: Any, report: Any, fail_on: Severity = Severity.WARNING, engine: str = "sglang") -> dict[str, Any]:
    """build before the fleet speed work (db7a76d), the reference: each target's signal_table, the fleet
    section from Timeline.stats, and one copying redact_strings over the whole document."""
    from diagnoser.outputs.fleet import fleet_section
    from diagnoser.rules import REGISTRY

    tls = collection.timelines
    starts = [s for tl in tls for s in [tl.span()[0]] if s is not None]
    ends = [e for tl in tls for e in [tl.span()[1]] if e is not None]
    version = next((tl.version for tl in tls if tl.version), None)
    usable = collection.usable()
    notes = {r.name for r in REGISTRY if r.note}
    findings = [f.to_dict() for f in report.findings if usable or f.rule not in notes]
    problems = any(f.severity >= fail_on and f.rule not in notes for f in report.findings)
    status = "error" if not usable else ("problems" if problems else "ok")
    untimed = any(tl.untimed for tl in tls)
    engines = {tl.target: getattr(tl, "engine", "sglang") for tl in tls}
    if engine == "sglang" and engines and set(engines.values()) != {"sglang"}:
        engine = "+".join(sorted(set(engines.values())))
    doc: dict[str, Any] = {
        "schema_version": R.SCHEMA_VERSION, "status": status, "engine": engine, "version": version,
        "inputs": [i.to_dict() for i in collection.inputs],
        "window": {"start": None if untimed else iso(min(starts)) if starts else None, "end": None if untimed else iso(max(ends)) if ends else None},
        "config": {tl.target: _old_config_table(tl) for tl in tls},
        "signals": {tl.target: R.signal_table(tl) for tl in tls},
        "findings": findings,
        "errors": [e.to_dict() for e in report.errors] + [{"source": "input", "error": m} for m in collection.errors],
    }
    if set(engines.values()) != {"sglang"} and engines:
        doc["engines"] = engines
    doc["top"] = R.top_causes(report, [tl.target for tl in tls])
    doc["checked"] = list(getattr(report, "checked", []))
    if getattr(collection, "fleet", None) is not None:
        doc["fleet"] = fleet_section(collection, report)
    return redact_strings(doc)  # type: ignore[no-any-return]


SECRETS = ("pw-fleet-label-1", "sk-fleet-model-2", "tok-fleet-job-3", "pw-fleet-instance-4")
LABELS = [{"job": "sglang", "instance": f"10.1.0.{i}:30000", "model_name": m} for i, m in
          enumerate(["llama"] * 30 + ["qwen"] * 14 + ["http://u:pw-fleet-label-1@h/m", '{"api_key": "sk-fleet-model-2"}'])]
LABELS.append({"job": "sglang token=tok-fleet-job-3", "instance": "u:pw-fleet-instance-4@10.1.9.9:30000", "model_name": "llama"})


CLEAN = [{"job": "sglang", "instance": f"10.2.0.{i}:30000", "model_name": "llama" if i % 3 else "qwen"} for i in range(40)]


def hostile_fleet(seed: int, labels: list[dict[str, str]] = LABELS) -> tuple[Any, Any]:
    """A fleet read through collect_prometheus from a fake Prometheus: 47 targets, secrets in labels, job
    and instance names (a target name), NaN in the values; then judged."""
    rng = random.Random(seed)
    LABELS = labels  # noqa: N806

    def series_of(kind: str, n: int = 5) -> list[dict[str, Any]]:
        return [matrix(lb, _values(rng, n, rng.choice(["rand", "ints", "const", "nan"])) if kind != "usage"
                       else [rng.choice([0.2, 0.5, 0.97, math.nan]) for _ in range(n)]) for lb in LABELS]

    fake = FakeProm([{"__name__": "sglang:num_running_reqs", **lb} for lb in LABELS],
                    {"num_running_reqs": series_of("x"), "num_queue_reqs": series_of("x"), "token_usage": series_of("usage"),
                     "num_used_tokens": series_of("x"), "gen_throughput": series_of("x"), "prompt_tokens_total": series_of("x"),
                     "generation_tokens_total": series_of("x"), "cache_hit_rate": series_of("x"),
                     "time_to_first_token_seconds": [matrix(lb, [0.3, 0.39, math.nan], step=60) for lb in LABELS]},
                    config=[{"metric": {"__name__": "sglang_max_total_num_tokens", **lb}, "values": [[T0, "200000"]]} for lb in LABELS[::2]])
    col = collect(fake)
    return col, evaluate(col.timelines, get_adapter())


@pytest.mark.parametrize("seed", range(3))
def test_build_is_the_plain_build_on_a_hostile_fleet(seed: int) -> None:
    col, rep = hostile_fleet(seed)
    assert len(col.timelines) == len(LABELS) and rep.findings and rep.checked
    doc = R.build(col, rep)
    same(doc, plain_build(col, rep))
    text = json.dumps(doc)
    assert not any(s in text for s in SECRETS)
    assert "10.1.0.3:30000" in text and "***" in text  # (shown, and something was hidden)


def test_build_is_the_plain_build_on_synthetic_fleets() -> None:
    for seed in range(3):
        tls = fleet_timelines(seed, 80)
        tls[3].target = "http://u:pw-target-5@h:1"  # a target name that redaction changes
        tls[4].series[("running_reqs", "token=tok-rank-6")] = next(iter(tls[4].series.values()))  # a rank too
        tls[5].meta["labels"] = {"instance": "u:pw-label-7@h"}
        col = SimpleNamespace(timelines=tls, inputs=[], errors=[], usable=lambda: True,
                              fleet={"prometheus": "http://u:pw-src-8@prom:9090", "range": {"step_s": 30.0}, "missing": {}, "failed_queries": {}})
        rep = evaluate(tls, get_adapter())
        doc = R.build(col, rep)
        same(doc, plain_build(col, rep))
        assert not any(s in json.dumps(doc) for s in ("pw-target-5", "tok-rank-6", "pw-label-7", "pw-src-8"))


def _containers(root: Any) -> dict[int, Any]:
    """Every dict and list reachable from ``root`` (through objects' attributes too), by id."""
    seen: dict[int, Any] = {}
    todo = [root]
    skip = (str, bytes, int, float, bool, type(None), np.ndarray, type, types.ModuleType, types.FunctionType)
    visited: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in visited or isinstance(obj, skip):
            continue
        visited.add(id(obj))
        if isinstance(obj, dict | list):
            seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
    return seen


@pytest.mark.parametrize("labels", [CLEAN, LABELS], ids=["clean", "secrets"])
def test_the_document_shares_no_container_with_what_it_was_built_from(labels: list[dict[str, str]]) -> None:
    """redact_owned returns what it leaves unchanged as it is: every part of the document is its own (with
    nothing to redact, nothing is copied by the door)."""
    col, rep = hostile_fleet(1, labels)
    inputs = _containers((col, rep))
    doc = R.build(col, rep)
    shared = [k for k in _containers(doc) if k in inputs]
    assert not shared, [inputs[k] for k in shared[:5]]
    assert len(_containers(doc)) > 1000  # (a document with something in it)


def test_owned_copies_every_container_and_keeps_scalars() -> None:
    import threading

    from diagnoser.model import owned

    lock = threading.Lock()  # (cannot be deep-copied: passed on as it is)
    inner = {"b": [1, "x", None]}
    value = {"a": inner, "t": (1, [2]), "s": "str", "n": 1.5, "l": ["p", "q"], "lock": lock, "deep": [[[{"k": "v"}]]]}
    out = owned(value)
    assert out == value and out is not value and out["a"] is not inner and out["a"]["b"] is not inner["b"]
    assert out["t"] == (1, [2]) and out["t"][1] is not value["t"][1] and out["l"] is not value["l"] and out["lock"] is lock
    assert not set(_containers(out)) & set(_containers(value))
    cycle: list[Any] = []
    cycle.append(cycle)
    assert owned(cycle)  # (a cycle is cut past a depth no output keeps, not followed for ever)


@pytest.mark.parametrize("seed", range(2))
def test_the_parts_built_while_the_rules_run_are_the_ones_build_makes(seed: int) -> None:
    """``prepare`` (run by ``evaluate``'s ``meanwhile`` while workers judge targets) gives the document
    build() makes alone; parts prepared from another list of timelines are not used."""
    col, rep = hostile_fleet(seed)
    prepared: list[R.Prepared] = []
    rep2 = evaluate(col.timelines, get_adapter(), workers=2, meanwhile=lambda: prepared.append(R.prepare(col)))
    assert len(prepared) == 1
    same(R.build(col, rep2, prepared=prepared[0]), R.build(col, rep))
    stale = R.prepare(SimpleNamespace(timelines=col.timelines[1:]))
    same(R.build(col, rep, prepared=stale), R.build(col, rep))
