"""The fleet pass's column-at-a-time paths agree with their references, bit for bit (issue 26).

- A whole pass over seeded, deliberately untidy fleets behind a stand-in Prometheus (DP ranks, duplicate
  TP ranks, both spellings, the pre-release ``name`` label, model-less series, two models behind one
  instance, series with gaps or starting late, NaN and infinite values, counter resets, prefill modes,
  histograms whose quantiles are NaN, pass the clock or sit in the +Inf bucket, config gauges, a label that
  is not a string): with every fast path on (``_BATCH``, ``bounds._FAST``) and off, the same timelines
  (every series' times, values and sources), config, meta, versions, fleet block and messages.
- Each fast path against its reference on its own: ``Series.with_rows`` / ``with_values``,
  ``quantile_columns`` / ``quantile_rows``, ``_discover`` / ``_discover_reference``, ``_config_facts`` /
  the config loop, ``quiet_targets`` / ``_unchanged`` per target, ``idle_times`` / its loop,
  ``_values_flat`` on one time grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import zlib
from typing import Any
from urllib.parse import parse_qs

import httpx
import numpy as np
import pytest

from diagnoser.engines import get_adapter
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.fleet import bounds as B
from diagnoser.fleet import collect_prometheus
from diagnoser.fleet import quantiles as QQ
from diagnoser.fleet import source as S
from diagnoser.fleet.promapi import PromAPI
from diagnoser.timeline import Series, Timeline

END = 1_800_000_000.0
LES = ("0.1", "0.5", "1", "5", "10", "+Inf")


def _ok(data: Any) -> httpx.Response:
    return httpx.Response(200, content=json.dumps({"status": "success", "data": data}).encode())


def _rng(seed: int, *parts: Any) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(repr(parts).encode())])


class Fleet:
    """A seeded fleet of SGLang targets answering the pass's queries as Prometheus would shape them."""

    def __init__(self, seed: int, n: int = 36) -> None:
        self.seed = seed
        rng = _rng(seed, "fleet")
        self.targets: list[dict[str, Any]] = []
        for i in range(n):
            labels = {"job": f"j{i % 3}", "instance": f"10.0.{i}.1:30000"}
            if i % 11 == 5:
                labels["name"] = "pre"  # the pre-release model label
            else:
                labels["model_name"] = "m2" if i % 13 == 7 else "m"
            if i % 13 == 7:  # a second model behind the same instance
                self.targets.append({"labels": {**labels, "model_name": "m"}, "ranks": [{}], "i": i, "spell": "sglang:"})
            ranks: list[dict[str, str]] = [{}]
            if i % 5 == 1:
                ranks = [{"dp_rank": "0", "tp_rank": "0"}, {"dp_rank": "1", "tp_rank": "1"}]
            elif i % 7 == 2:
                ranks = [{"tp_rank": "0"}, {"tp_rank": "1"}]  # every TP rank exports: the lowest counts
            self.targets.append({"labels": labels, "ranks": ranks, "i": i, "spell": "sglang_" if rng.random() < 0.3 else "sglang:"})
        self.grid = [END - 600 + 30 * k for k in range(21)]
        self.late = {t["i"]: int(rng.integers(1, 15)) for t in self.targets if rng.random() < 0.2}  # series starting late
        self.gaps = {t["i"] for t in self.targets if rng.random() < 0.15}  # a point missing here and there
        self.idle = {t["i"] for t in self.targets if rng.random() < 0.5}  # nothing running at some steps

    def series(self) -> list[dict[str, str]]:
        out = []
        for t in self.targets:
            for r in t["ranks"]:
                for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "time_to_first_token_seconds_count"):
                    out.append({"__name__": t["spell"] + name, **t["labels"], **r, "engine_type": "unified", "moe_ep_rank": "0"})
        out.append({"__name__": "sglang:evicted_tokens_total", "job": "j0", "instance": "10.0.0.1:30000", "cache_type": "RadixCache"})
        return out

    def _times(self, t: dict[str, Any], step: float) -> list[float]:
        times = [x for x in self.grid if (x - self.grid[0]) % step == 0] if step > 30 else list(self.grid)
        times = times[self.late.get(t["i"], 0) if step == 30 else 0:]
        if t["i"] in self.gaps and len(times) > 4:
            times = times[:2] + times[3:]
        return times

    def matrix(self, q: str) -> list[dict[str, Any]]:
        m = re.search(r'__name__=~"sglang\[:_\]\(?([A-Za-z_|]+)\)?', q)
        if not m:
            return []
        bucket = "_bucket" in q
        names = [n.removesuffix("_bucket") for n in m.group(1).split("|")]
        out: list[dict[str, Any]] = []
        for t in self.targets:
            rng = _rng(self.seed, q, t["i"], t["labels"].get("model_name"))
            name = names[int(rng.integers(len(names)))]
            if rng.random() < 0.1 and not bucket:
                continue  # this target does not export it
            if bucket:
                if name != "time_to_first_token_seconds" and rng.random() < 0.5:
                    continue
                out.extend(self._buckets(t, name, q, rng))
                continue
            for r in t["ranks"]:
                labels = {**t["labels"], **r}
                if not q.startswith("rate("):
                    labels["__name__"] = t["spell"] + name
                if "mode=" in q or name in ("realtime_tokens_total", "prefill_effective_tokens_total"):
                    modes = ["decode"] if 'mode="decode"' in q else (["prefill_compute", "prefill_cache"] if name == "realtime_tokens_total"
                                                                     else ["input", "device_hit"])
                else:
                    modes = [""]
                for mode in modes:
                    lab = {**labels, "mode": mode} if mode else labels
                    times = self._times(t, 30)
                    vals = self._values(name, t, len(times), rng)
                    out.append({"metric": lab, "values": [[x, v] for x, v in zip(times, vals, strict=True)]})
        if _rng(self.seed, q).random() < 0.1 and out:  # a label that is not a string: the reference drops that result and counts it
            out.append({"metric": {**out[0]["metric"], "tp_rank": 3}, "values": out[0]["values"]})
        return out

    def _values(self, name: str, t: dict[str, Any], n: int, rng: np.random.Generator) -> list[str]:
        if name == "num_running_reqs" or name == "num_queue_reqs":
            x = rng.integers(0, 4, n).astype(float)
            if t["i"] not in self.idle:
                x += 1
        elif name.endswith("_total") or name == "total_retracted_reqs":
            x = np.cumsum(rng.integers(0, 50, n)).astype(float)
            if rng.random() < 0.3:
                x[n // 2:] -= x[n // 2]  # a restart
        else:
            x = rng.random(n) * 10.0 ** rng.integers(-3, 4)  # floats of 17 significant digits too
        vals = [repr(float(v)) for v in x]
        if rng.random() < 0.05:
            vals[int(rng.integers(n))] = str(rng.choice(["NaN", "+Inf", "-Inf", "1e309"]))
        return vals

    def _buckets(self, t: dict[str, Any], name: str, q: str, rng: np.random.Generator) -> list[dict[str, Any]]:
        times = self._times(t, 120)
        kind = rng.integers(0, 4)  # 0: idle (NaN quantiles), 1: fast, 2: slow (past the clock), 3: in +Inf
        out = []
        dens = {0: [0, 0, 0, 0, 0, 0], 1: [3, 1, 0, 0, 0, 0], 2: [0, 0, 1, 1, 4, 0], 3: [0, 0, 0, 0, 1, 6]}[int(kind)]
        cum = np.cumsum(dens).astype(float) * rng.uniform(0.5, 2.0)
        for le, c in zip(LES, cum.tolist(), strict=True):
            out.append({"metric": {**t["labels"], "le": le}, "values": [[x, repr(c)] for x in times]})
        return out

    def config(self) -> list[dict[str, Any]]:
        out = []
        for t in self.targets:
            rng = _rng(self.seed, "cfg", t["i"])
            for name, v in (("max_total_num_tokens", "65536"), ("page_size", "1"), ("context_len", repr(float(rng.integers(1, 9) * 4096)))):
                r = t["ranks"][0]
                vals = [[x, v] for x in self.grid[::5]]
                if rng.random() < 0.1:
                    vals[-1][1] = "NaN"
                out.append({"metric": {"__name__": t["spell"] + name, **t["labels"], **r}, "values": vals})
        return out

    def __call__(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode()) if request.method == "POST" else parse_qs(request.url.query.decode())
        path = request.url.path
        if path == "/api/v1/series":
            return _ok(self.series())
        if path.startswith("/api/v1/label/"):
            return _ok(["j0", "j1", "j2"])
        q = form["query"][0]
        if path == "/api/v1/query":
            if q.endswith("s]"):  # the probe: raw samples every 30 s
                t = self.targets[0]
                return _ok({"resultType": "matrix", "result": [{"metric": {"__name__": "sglang:num_running_reqs", **t["labels"]},
                                                                "values": [[x, "1"] for x in self.grid]}]})
            return _ok({"resultType": "vector", "result": []})
        if q.startswith("count by (__name__, le)"):
            return _ok({"resultType": "matrix", "result": [
                {"metric": {"__name__": "sglang:time_to_first_token_seconds_bucket", "le": le}, "values": [[END, str(len(self.targets))]]}
                for le in LES]})
        if "max_total_num_tokens|" in q:
            return _ok({"resultType": "matrix", "result": self.config()})
        return _ok({"resultType": "matrix", "result": self.matrix(q)})


def _args() -> argparse.Namespace:
    return argparse.Namespace(prometheus="http://prom.test:9090", selector="", range=None, step=None, rate_window=None, end=END,
                              timeout=5.0, bearer_token=None, basic_auth=None, header=[])


def _canon(x: Any) -> Any:
    """Everything, floats to the bit."""
    if isinstance(x, float):
        return ("f", x.hex())
    if isinstance(x, np.ndarray):
        return ("a", str(x.dtype), x.tobytes())
    if isinstance(x, dict):
        return ("d", [(_canon(k), _canon(v)) for k, v in x.items()])
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, set | frozenset):
        return ("s", sorted(repr(_canon(v)) for v in x))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, [(f.name, _canon(getattr(x, f.name))) for f in dataclasses.fields(x)])
    return x


def _pass(fleet: Fleet, fast: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(S, "_BATCH", fast)
    monkeypatch.setattr(B, "_FAST", fast)
    api = PromAPI("http://prom.test:9090", timeout=5.0, client=httpx.Client(transport=httpx.MockTransport(fleet)))
    col = collect_prometheus(_args(), get_adapter(), api=api)
    tls = [{"target": tl.target, "version": tl.version, "config": _canon(tl.config), "meta": _canon(tl.meta),
            "series": sorted((k, s.ts.tobytes(), s.values.tobytes(), tuple(s.sources)) for k, s in tl.series.items())}
           for tl in col.timelines]
    fleet_part = {k: v for k, v in col.fleet.items() if k not in ("query_seconds", "collect_seconds")}
    fleet_part["dropped"] = sorted(fleet_part["dropped"].items())  # (counted as the answers arrive: in no set order)
    return col, {"timelines": tls, "fleet": _canon(fleet_part), "versions": _canon(col.versions), "inputs": _canon(col.inputs)}


@pytest.mark.parametrize("seed", range(7))  # (seeded: each of these fleets has quiet targets and targets bounded)
def test_a_whole_pass_is_the_same_with_the_fast_paths_on_and_off(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet(seed)
    calls: dict[str, int] = {"rows": 0, "quiet": 0, "bounded": 0, "changed": 0, "columns": 0}
    with_rows, quiet, bound, cols = Series.with_rows, S.quiet_targets, S.bound_quantiles, S._ingest_columns

    def count_rows(self: Series, rows: Any) -> Any:
        calls["rows"] += len(rows)
        return with_rows(self, rows)

    def count_quiet(*a: Any) -> Any:
        out = quiet(*a)
        calls["quiet"] += len(out)
        return out

    def count_bound(*a: Any) -> int:
        n = bound(*a)
        calls["bounded"] += 1
        calls["changed"] += n
        return n

    def count_cols(*a: Any) -> int:
        calls["columns"] += 1
        return cols(*a)

    monkeypatch.setattr(Series, "with_rows", count_rows)
    monkeypatch.setattr(S, "quiet_targets", count_quiet)
    monkeypatch.setattr(S, "bound_quantiles", count_bound)
    monkeypatch.setattr(S, "_ingest_columns", count_cols)
    col_f, fast = _pass(fleet, True, monkeypatch)
    used = dict(calls)
    col_r, ref = _pass(fleet, False, monkeypatch)
    assert len(col_f.timelines) > 30
    for key in ref:
        assert fast[key] == ref[key], key
    # the fast paths ran: series written a grid at a time, quantiles as columns, quiet targets skipped and
    # the others bounded, some of their points changed; and the reference path used none of them
    assert used["rows"] > 100 and used["columns"] > 0 and used["quiet"] > 0 and used["bounded"] > 0 and used["changed"] > 0, used
    assert calls["rows"] == used["rows"] and calls["columns"] == used["columns"]
    assert col_f.fleet["dropped"] and col_f.fleet["dropped"] == col_r.fleet["dropped"]


# -- each fast path on its own ------------------------------------------------------------------------------
def test_with_rows_equals_with_values_and_copies_on_write() -> None:
    ts = np.array([1.0, 2.0, 3.0])
    grid = Series(ts, np.zeros(3), ["a:1", "b", "c:3"])
    rows = np.arange(12, dtype=float).reshape(4, 3)
    got = grid.with_rows(rows)
    want = [grid.with_values(r) for r in rows]
    assert got == want and [s.sources.tolist() for s in got] == [s.sources.tolist() for s in want]
    got[1].append(4.0, 9.0, "d")  # a write copies first: the other rows and the grid keep theirs
    assert got[1].values.tolist() == [3.0, 4.0, 5.0, 9.0] and got[2].values.tolist() == [6.0, 7.0, 8.0]
    assert len(grid) == 3 and rows[1].tolist() == [3.0, 4.0, 5.0]
    with pytest.raises(ValueError):
        grid.with_rows(np.zeros((2, 4)))
    part = grid.slice(2.0, None)  # not the whole buffer: one with_values each
    assert part.with_rows(np.ones((2, 2))) == [part.with_values(np.ones(2))] * 2


def _bucket_rows(seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(int(rng.integers(1, 30))):
        labels = {"job": "j", "instance": f"i{g % 7}", "model_name": "m" if g % 5 else "", **({"name": "x"} if g % 9 == 4 else {})}
        labels = {k: v for k, v in labels.items() if v or k != "model_name" or g % 2}
        for le in rng.permutation(LES).tolist():
            if rng.random() < 0.1:
                continue
            times = [1000 + 60 * k for k in range(5) if rng.random() < 0.9]
            rows.append({"metric": {**labels, "le": le}, "values": [[x, repr(float(rng.integers(0, 5)))] for x in times]})
    if seed % 3 == 0:
        rng.shuffle(rows)  # groups not next to each other
    return rows


@pytest.mark.parametrize("seed", range(15))
def test_quantile_columns_equal_quantile_rows(seed: int) -> None:
    rows = _bucket_rows(seed)
    want = QQ.quantile_rows(rows, (0.5, 0.95))
    got = QQ.quantile_columns(rows, (0.5, 0.95))
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert {q: repr(c.rows()) for q, c in got.items()} == {q: repr(r) for q, r in want.items()}


def test_quantile_columns_decline_what_quantile_rows_declines() -> None:
    from tests.test_fleet_local_quantiles import PLAIN, _row

    cases = [PLAIN, [], PLAIN + [_row("0x10", [1, 1])], PLAIN + [_row("1.0", [1, 1], instance="k")],
             PLAIN + [{"metric": {"job": "j"}, "values": [[1000, "1"]]}], PLAIN + [_row("3", [float("nan"), 1])],
             PLAIN + [_row("1", [1, 1], tp_rank="1"), _row("1", [1, 1], tp_rank="2")],
             PLAIN + [{"metric": {"job": 3, "le": "1"}, "values": [[1000, "1"]]}], [1, 2], [{"values": []}], [{"metric": {}}]]
    for rows in cases:
        want = QQ.quantile_rows(rows, (0.5,))
        got = QQ.quantile_columns(rows, (0.5,))
        assert (got is None) == (want is None), rows
        if got is not None and want is not None:
            assert repr(got[0.5].rows()) == repr(want[0.5])


def _found(seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(40):
        inst = f"h{int(rng.integers(0, 12))}:1"
        m = {"__name__": str(rng.choice(["sglang:num_running_reqs", "sglang_token_usage", "sglang:http_requests_active", "other"])),
             "job": "j", "instance": inst}
        model = str(rng.choice(["m", "n", ""]))
        if model:
            m["name" if rng.random() < 0.2 else "model_name"] = model
        if rng.random() < 0.5:
            m["engine_type"] = str(rng.choice(["unified", "prefill", ""]))
        if rng.random() < 0.3:
            m["tp_rank"] = "0"
        out.append(m)
    out.sort(key=lambda m: not (m.get("model_name") or m.get("name")))
    return out


@pytest.mark.parametrize("seed", range(10))
def test_discover_equals_the_reference(seed: int) -> None:
    a, b = S._Targets(), S._Targets()
    S._discover(_found(seed), a)
    S._discover_reference(_found(seed), b)
    assert list(a.keys) == list(b.keys) and a.by_instance == b.by_instance and list(a.by_instance) == list(b.by_instance)
    for attr in ("labels", "names", "spellings", "sched", "engine_types"):  # (looked up by target: their order is not read)
        assert getattr(a, attr) == getattr(b, attr), attr
    assert [tl.meta for tl in a.keys.values()] == [tl.meta for tl in b.keys.values()]


def _config_rows(seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    rows: list[Any] = []
    for i in range(20):
        m = {"__name__": str(rng.choice(["sglang:max_total_num_tokens", "sglang_page_size", "sglang:other", "x"])),
             "job": "j", "instance": f"h{i % 6}:1", "model_name": "m" if i % 4 else ""}
        if rng.random() < 0.2:
            m["dp_rank"] = str(rng.choice(["0", "1"]))
        vals = [[1000 + 15 * k, repr(float(rng.integers(0, 4) * 1.5))] for k in range(3)]
        rows.append({"metric": m, "values": vals})
    bad = int(rng.integers(0, 7))
    if bad == 1:
        rows[3]["values"][1][1] = "NaN"
    elif bad == 2:
        rows[4]["values"] = []
        rows[4]["value"] = [1000, "7"]
    elif bad == 3:
        rows[5]["metric"]["tp_rank"] = 1
    elif bad == 4:
        rows.append("x")
    elif bad == 5:
        rows[6]["values"] = rows[6]["values"][::-1]
    return rows


@pytest.mark.parametrize("seed", range(14))
def test_config_facts_equal_the_config_loop(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    out = []
    for fast in (True, False):
        monkeypatch.setattr(S, "_BATCH", fast)
        t = S._Targets()
        for i in range(6):
            t.add(("j", f"h{i}:1", "m"))
        t.frozen = True
        S._ingest_config(_config_rows(seed), t)
        out.append(([(k, _canon(tl.config)) for k, tl in t.keys.items()], t.dropped))
    assert out[0] == out[1]


def _quiet_fleet(seed: int) -> tuple[list[Timeline], dict[str, list[Any]], dict[int, VersionRange | None]]:
    """Timelines whose running, queued and quantile series were written a grid at a time, as the pass does."""
    rng = np.random.default_rng(seed)
    n, g = 30, 21
    grid_t = 1000.0 + 30 * np.arange(g)
    qt = grid_t[::4]
    tls = [Timeline(target=f"t{i}") for i in range(n)]
    rows: dict[str, list[Any]] = {}

    def write(signal: str, times: np.ndarray, vals: np.ndarray, source: str, members: list[int]) -> None:
        grid = Series(times, np.zeros(len(times)), [f"{source} @{t:g}" for t in times])
        series = grid.with_rows(vals)
        for j, s in zip(members, series, strict=True):
            tls[j].series[(signal, "")] = s
        rows.setdefault(signal, []).append(([tls[j] for j in members], series, times, vals))

    everyone = list(range(n))
    write("running_reqs", grid_t, rng.integers(0, 3, (n, g)).astype(float) * (rng.random((n, 1)) < 0.8), "r", everyone)
    write("queue_reqs", grid_t, rng.integers(0, 2, (n, g)).astype(float) * (rng.random((n, 1)) < 0.7), "q", everyone)
    for name, base in (("ttft_seconds_p95", "time_to_first_token_seconds"), ("e2e_seconds_p95", "e2e_request_latency_seconds")):
        vals = rng.choice([0.05, 0.3, 2.0, 45.0, 400.0, float("nan")], (n, len(qt)), p=[0.3, 0.3, 0.2, 0.05, 0.05, 0.1])
        vals *= rng.uniform(0.5, 1.5, (n, len(qt)))
        write(name, qt, vals, f"prometheus histogram_quantile(0.95, sglang:{base}[60s])", everyone)
    if seed % 2:  # a series some targets hold that was not written so: those are bounded as before
        for j in range(0, n, 7):
            tls[j].add_many("itl_seconds_p95", qt, np.full(len(qt), 3.0), ["prometheus histogram_quantile(0.95, sglang:inter_token_latency_seconds[60s])"] * len(qt))
    versions: dict[int, VersionRange | None] = {id(tl): (VersionRange() if k % 3 else None) for k, tl in enumerate(tls)}
    return tls, rows, versions


@pytest.mark.parametrize("seed", range(10))
def test_quiet_targets_are_those_unchanged_finds_unchanged(seed: int) -> None:
    tls, rows, versions = _quiet_fleet(seed)
    buckets = {"e2e_request_latency_seconds": (1.0, 10.0, 100.0)} if seed % 3 else {}
    if seed % 4 == 1:
        buckets["time_to_first_token_seconds"] = (0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
    quiet = B.quiet_targets(tls, rows, versions, buckets)
    for tl in tls:
        idle = B.idle_times(tl)
        names = [n for (n, r) in tl.series if r == "" and B._quantile_stem(n)]
        want = all(B._unchanged(tl.series[(n, "")], n.rsplit("_p", 1)[0], versions[id(tl)], buckets, idle) for n in names)
        written = ("itl_seconds_p95", "") not in tl.series  # (a series not written a grid at a time: bounded as before)
        assert (id(tl) in quiet) == (want and written), tl.target
        if id(tl) in quiet:
            assert B.bound_quantiles(tl, versions[id(tl)], buckets) == 0
    assert 0 < len(quiet) < len(tls)


@pytest.mark.parametrize("seed", range(6))
def test_idle_times_on_one_grid_equal_the_loop(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    tls, _rows, _v = _quiet_fleet(seed)
    for tl in tls[:10]:
        monkeypatch.setattr(B, "_FAST", True)
        got = B.idle_times(tl)
        monkeypatch.setattr(B, "_FAST", False)
        want = B.idle_times(tl)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


GRIDS = {
    "one grid": [[[1700000000 + 30 * j, f"{j}"] for j in range(5)] for _ in range(4)],
    "one grid, float times": [[[1700000000.5 + 30 * j, "1"] for j in range(3)] for _ in range(3)],
    "a zero time": [[[0, "1"], [1, "2"]], [[-0.0, "1"], [1, "2"]]],
    "true for 1": [[[1, "1"], [2, "2"]], [[True, "1"], [2, "2"]]],
    "an int and an equal float": [[[1, "1"], [2, "2"]], [[1.0, "1"], [2, "2"]]],
    "a string time on the grid": [[[1, "1"]], [["1", "1"]]],
    "a huge int": [[[10**30, "1"]], [[10**30, "1"]]],
    "lengths differ, total the same": [[[1, "1"], [2, "2"]], [[1, "1"]], [[1, "1"], [2, "2"], [3, "3"]]],
}


@pytest.mark.parametrize("case", sorted(GRIDS))
def test_one_grid_converts_as_each_point(case: str) -> None:
    lists = GRIDS[case]
    got = S._values_flat(lists)
    ref = [S._values(v, S._Targets()) for v in lists]
    if got is None:
        return
    ts, vs, ends = got
    a = 0
    for (rt, rv), b in zip(ref, ends.tolist(), strict=True):
        assert ts[a:b].tobytes() == rt.tobytes() and vs[a:b].tobytes() == rv.tobytes(), case
        a = b
