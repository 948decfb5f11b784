"""The SGLang catalogue (diagnoser/engines/sglang/catalogue, generated from every release on PyPI by
scripts/sglang_catalogue.py) and what is built on it: the template matcher, the coverage of every
template by the reader, flags and metrics by release. No downloads: the catalogue is committed.

The acceptance lines are built from the releases' own templates (the catalogue's text, with values put in
its placeholders), not from a thread's numbers."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from diagnoser.cli import sglang_coverage as coverage
from diagnoser.engines.sglang import catalogue, flags, templates
from diagnoser.evaluate import Report, check_suggestions
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.timeline import Timeline
from tests.helpers import READ_PATHS, read_log_bytes
from tests.rules.helpers import run

PREFIX = "[2026-10-30 10:00:{s:02d} TP0] "


def _compiled(pattern: str, release: str) -> templates.Compiled:
    """The template whose first line matches ``pattern`` and that exists at ``release``."""
    idx = catalogue.releases().index(release)
    hits = [c for c in templates.compiled() if re.search(pattern, c.template.first_line)
            and any(a <= idx <= b for a, b in c.template.releases)]
    assert hits, f"no template /{pattern}/ at {release}"
    return hits[0]


def _log(lines: list[str]) -> bytes:
    return "".join(PREFIX.format(s=i) + line + "\n" for i, line in enumerate(lines)).encode()


# -- the catalogue ------------------------------------------------------------------------------------
def test_catalogue_covers_every_release_from_0_1_to_0_5_23() -> None:
    rels = catalogue.releases()
    assert rels[0] == "0.1.3" and rels[-1] == "0.5.23" and len(rels) >= 150
    assert "0.4.1.post7" in rels and "0.5.0" not in rels
    assert list(catalogue.release_versions()) == sorted(catalogue.release_versions())
    n = len(rels)
    for kind in (catalogue.templates(), catalogue.metrics(), catalogue.server_args(), catalogue.server_info_keys()):
        assert kind
        for e in kind:
            assert e["releases"] and all(0 <= a <= b < n for a, b in e["releases"])
            assert all(re.fullmatch(r"sglang/srt/\S+\.py:\d+", at) for at in e["at"].values())
    by_name = {m["name"]: m for m in catalogue.metrics()}
    assert by_name["sglang:num_running_reqs"]["type"] == "gauge"
    assert by_name["sglang:num_aborted_requests_total"]["type"] == "counter"
    keys = {k["key"] for k in catalogue.server_info_keys()}
    assert "version" in keys and "internal_states" in keys


def test_every_release_has_its_state_lines() -> None:
    """Each release's decode and prefill lines are in the catalogue (0.1.x prints its decode line without a
    header, ``#running-req: …``, and its prefill line as ``new fill batch``)."""
    fams: dict[int, set[str]] = {}
    for c in templates.compiled():
        for a, b in c.template.releases:
            for i in range(a, b + 1):
                fams.setdefault(i, set()).add(c.family or "")
    for i in range(len(catalogue.releases())):
        assert {"decode_batch", "prefill_batch"} <= fams[i], catalogue.releases()[i]


# -- coverage: the CI check ---------------------------------------------------------------------------
def test_coverage_unknown_is_zero_for_every_release() -> None:
    rows = coverage.per_release()
    assert len(rows) == len(catalogue.releases())
    bad = [(r["release"], r["unknown"]) for r in rows if r["unknown"]]
    assert not bad, "unknown templates: " + "; ".join(
        f"{v.template.id} {v.template.file}: {v.template.first_line[:100]}" for v in coverage.unknown()[:20])
    assert all(r["recognised"] > 0 for r in rows)
    assert sum(r["recognised"] for r in rows) > 3000


def test_ignore_groups_are_reviewed_and_used() -> None:
    groups = coverage.ignore_groups()
    assert len({g.name for g in groups}) == len(groups)
    used = {v.why for v in coverage.verdicts() if v.status == "ignored"}
    for g in groups:
        assert len(g.reason) > 40, g.name
        assert g.name in used, f"ignore group {g.name} covers nothing: remove it"


def test_state_families_are_recognised_not_ignored() -> None:
    """The templates whose meaning is written down (templates.FAMILIES) and that the reader acts on are
    read, at every release that prints them."""
    acting = {f.name for f in templates.FAMILIES if f.apply} | {"decode_batch", "prefill_batch", "scheduler_summary", "kv_allocated"}
    for v in coverage.verdicts():
        fam = next(c.family for c in templates.compiled() if c.template.id == v.template.id)
        if fam in acting:
            assert v.status == "recognised", (fam, v.template.file, v.template.first_line[:120])


def test_coverage_command(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main

    assert main(["catalogue", "coverage", "--release", "0.5.23"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^0\.5\.23\s+\d+\s+\d+\s+\d+\s+0$", out, re.M), out
    assert main(["catalogue", "coverage", "--release", "9.9.9"]) == 2
    assert "is not in the catalogue" in capsys.readouterr().err
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["catalogue", "coverage", "--format", "markdown"]) == 0
    assert buf.getvalue().count("\n| 0.") == len(catalogue.releases())


def test_docs_show_the_coverage_table() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "catalogue.md").read_text()
    table = coverage.table(markdown=True)
    assert table in doc, "docs/catalogue.md's coverage table is stale: diagnose catalogue coverage --format markdown"


# -- the matcher ---------------------------------------------------------------------------------------
def test_match_names_fields_by_the_label_sglang_prints() -> None:
    c = _compiled(r"^Decode batch", "0.5.23")
    body = templates.instance(c, {"#running-req": "37", "gen throughput (token/s)": "812.55", "#queue-req": "4"})
    m = templates.match(body or "")
    assert m is not None and m.family == "decode_batch"
    assert m.fields["#running-req"] == 37 and m.fields["#queue-req"] == 4
    assert m.fields["gen throughput (token/s)"] == pytest.approx(812.55)
    assert templates.match("nothing SGLang prints at all") is None


# -- acceptance: each kind of line named in issue 24's Why, from its release's template ------------------
@pytest.mark.parametrize("how", READ_PATHS)
@pytest.mark.parametrize("role_backend", ["target verify CUDA graph", "target decode CUDA graph", "target decode XPU graph"])
@pytest.mark.parametrize(("release", "shape"), [("0.5.23", r"^Capture .* end\. bs="), ("0.5.16", r"^Capture .* begin\. .*\bbs="),
                                                ("0.5.14", r"^Capture .* begin\. .*\bbs=")])
def test_newer_graph_capture_shape_reaches_cg01(how: str, role_backend: str, release: str, shape: str) -> None:
    """0.5.14-0.5.21 print the captured sizes on the begin line (``Capture {capture_name} {graph_backend}
    begin. backend=…, bs=[…]``), 0.5.22+ on the end line (model_runner_components/cuda_graph_setup.py:787 at
    0.5.23): the captured maximum is read, and far below the effective max_running_requests CG01 says so
    before load."""
    end = _compiled(shape, release)
    summary = _compiled(r"^max_total_num_tokens=.*available_gpu_mem", "0.5.23")
    capture = templates.instance(end, {end.keys[0]: role_backend.rsplit(" ", 2)[0], end.keys[1]: " ".join(role_backend.rsplit(" ", 2)[1:]),
                                       "bs": "[1, 2, 4, 8]", "elapsed": "12.40", "mem usage": "0.61", "avail mem": "9.80",
                                       "backend": "full"})
    first = templates.instance(summary, {"max_total_num_tokens": "1048576", "chunked_prefill_size": "8192", "max_prefill_tokens": "16384",
                                         "max_running_requests": "1024", "context_len": "32768"}, fill={"float": "30.25", "any": "available_gpu_mem"})
    assert capture and first
    _, tl = read_log_bytes(_log([first, capture]), "server.log", how)
    assert tl.cfg("cuda_graph_max_bs_captured") == 8
    assert tl.cfg("max_running_requests") == 1024
    from diagnoser.rules.cg01_cuda_graph_disabled_or_exceeded import CudaGraphDisabledOrExceeded

    f = run(CudaGraphDisabledOrExceeded, tl, version=(0, 5, 23))
    assert f is not None, "CG01 did not see the captured maximum"
    assert "8" in " ".join(str(e.observed) for e in f.evidence)


def test_a_draft_graph_does_not_set_the_target_cap() -> None:
    end = _compiled(r"^Capture .* end\. bs=", "0.5.23")
    body = templates.instance(end, {"capture_name": "draft decode", "graph_backend[model_runner.device]": "CUDA graph", "bs": "[1, 2]"})
    _, tl = read_log_bytes(_log([body or ""]), "server.log", "line")
    assert tl.cfg("cuda_graph_max_bs_captured") is None


@pytest.mark.parametrize("how", READ_PATHS)
@pytest.mark.parametrize("release", ["0.2.14", "0.5.4", "0.5.23"])
def test_negative_profiled_pool_says_no_kv_memory(how: str, release: str) -> None:
    """``max_total_tokens=R is larger than the profiled value P`` with P < 0 (model_runner.py:355 at 0.2.14,
    :1692 at 0.5.4; mem_cache/kv_cache_configurator.py:3102 at 0.5.23): no KV memory at all, an OOM at
    start-up (ER01)."""
    c = _compiled(r"is larger than the profiled value", release)
    keys = c.keys
    body = templates.instance(c, {keys[0]: "65536", keys[1]: "-5321"})
    r, tl = read_log_bytes(_log([body or ""]), "server.log", how)
    evs = [e for e in tl.events if e.kind == "startup_oom"]
    assert evs and "no KV memory" in evs[0].fields["text"]
    assert tl.cfg("max_total_tokens_requested") == 65536
    from diagnoser.rules.er01_oom import OOM

    f = run(OOM, tl, version=catalogue.release_version(release))
    assert f is not None and f.severity == Severity.CRITICAL
    assert any("no KV memory" in str(e.observed) for e in f.evidence)


def test_positive_profiled_pool_is_no_oom() -> None:
    c = _compiled(r"is larger than the profiled value", "0.5.23")
    body = templates.instance(c, {c.keys[0]: "65536", c.keys[1]: "40000"})
    _, tl = read_log_bytes(_log([body or ""]), "server.log", "line")
    assert not [e for e in tl.events if e.kind == "startup_oom"]
    assert tl.cfg("max_total_tokens_requested") == 65536


@pytest.mark.parametrize("how", READ_PATHS)
def test_old_retraction_and_summary_lines(how: str) -> None:
    """0.1.x prints ``decode out of memory happened, #retracted_reqs: N, …`` and ``Rank 0:
    max_total_num_token=…`` (managers/router/model_rpc.py), which the reader's own patterns missed."""
    retract = _compiled(r"^decode out of memory happened", "0.1.13")
    summary = _compiled(r"^Rank .*max_total_num_token=", "0.1.13")
    lines = [templates.instance(summary, {"max_total_num_token": "70000", "max_prefill_num_token": "8192", "context_len": "4096"}),
             templates.instance(retract, {"#retracted_reqs": "3", "#new_token_ratio": "0.4000", "#new_token_ratio#2": "0.5000"})]
    r, tl = read_log_bytes(_log([x or "" for x in lines]), "server.log", how)
    assert tl.cfg("max_total_tokens") == 70000
    evs = [e for e in tl.events if e.kind == "retraction"]
    assert len(evs) == 1 and evs[0].fields["retracted_reqs"] == 3
    assert r.parser.version.high <= (0, 2, 15)


@pytest.mark.parametrize("how", READ_PATHS)
def test_max_running_requests_reduced_per_dp_worker(how: str) -> None:
    c = _compiled(r"^max_running_requests was reduced from the requested", "0.5.23")
    body = templates.instance(c, {c.keys[0]: "512", c.keys[1]: "96"})
    _, tl = read_log_bytes(_log([body or ""]), "server.log", how)
    assert tl.cfg("max_running_requests") == 96 and tl.cfg("max_running_requests_requested") == 512
    assert [e.fields["effective"] for e in tl.events if e.kind == "max_running_requests_reduced"] == [96]


def test_aborted_counter_is_read_in_both_spellings() -> None:
    """``sglang:num_aborted_requests_total`` as the catalogue defines it (a counter; its labels) is read
    from an exposition in SGLang's spelling and after a Prometheus hop (underscore)."""
    from prometheus_client.parser import text_string_to_metric_families

    from diagnoser.engines.sglang.metrics import (
        MetricsState,
        fast_samples,
        ingest_samples,
        samples_from_families,
    )

    m = next(m for m in catalogue.metrics() if m["name"] == "sglang:num_aborted_requests_total")
    labels = m["labels"] if isinstance(m["labels"], list) else ["model_name"]
    lab = ",".join(f'{k}="v{i}"' for i, k in enumerate(labels))
    for spelled in ("sglang:num_aborted_requests_total", "sglang_num_aborted_requests_total"):
        text = f"# TYPE {spelled} counter\n{spelled}{{{lab}}} 7.0\n"
        fast = fast_samples(text)
        assert [(n, v) for n, _, v in fast] == [("num_aborted_requests_total", 7.0)]
        if ":" not in spelled:
            assert samples_from_families(text_string_to_metric_families(text)) == fast
        st = MetricsState()
        tl = Timeline(target="t")
        ingest_samples(fast, 1.0, tl, st, "m")
        assert "num_aborted_requests_total" in st.seen_names
        series = tl.get("aborted_total")  # the request-outcome signal the request_outcomes rule reads
        assert series is not None and list(series.values) == [7.0]


def test_every_catalogue_metric_is_wanted() -> None:
    from diagnoser.engines.sglang.metric_names import WANTED, catalogue_sample_names

    names = catalogue_sample_names()
    assert {"num_running_reqs", "num_aborted_requests_total", "time_to_first_token_seconds_count", "e2e_request_latency_seconds_sum"} <= names
    assert names <= WANTED


# -- flags by release ----------------------------------------------------------------------------------
def test_flags_at_release_come_from_the_release() -> None:
    assert flags.at_release("--cuda-graph-max-bs", (0, 5, 23)) is None  # removed in 0.5.20
    assert flags.respell("--cuda-graph-max-bs", (0, 5, 23)).flag == "--cuda-graph-max-bs-decode"
    old = flags.at_release("--cuda-graph-max-bs", (0, 5, 16))
    assert old is not None and old.deprecated  # an alias of --cuda-graph-max-bs-decode then
    assert flags.at_release("--max-running-requests", (0, 1, 13)) is None
    assert flags.at_release("--schedule-conservativeness", (0, 5, 23)).default == 1.0
    assert flags.at_release("--enable-dp-attention", (0, 5, 23)).deprecated
    assert not flags.available("max_running_requests", (0, 1, 13)) and flags.available("max_running_requests", (0, 2, 0))
    assert flags.available("hierarchical_cache", (0, 4, 3)) and not flags.available("hierarchical_cache", (0, 4, 2))


def _report(flag: str, version: tuple[int, int, int]) -> tuple[Report, Timeline]:
    tl = Timeline(target="t")
    tl.meta["version_best"] = list(version)
    f = Finding(rule="kv_retraction", severity=Severity.WARNING, confidence="high", target="t", summary="x",
                suggestions=[Suggestion(flag=flag, current=None, proposed=1.3, why="w")])
    return Report(findings=[f]), tl


def test_a_flag_the_release_lacks_is_not_suggested() -> None:
    rep, tl = _report("--max-running-requests", (0, 1, 13))
    check_suggestions(rep, [tl])
    assert rep.findings[0].suggestions == []
    assert [d["reason"] for d in rep.dropped] == ["--max-running-requests does not exist in SGLang 0.1.13 (its ServerArgs, catalogue)"]
    assert any("does not exist in SGLang 0.1.13" in n for n in rep.findings[0].notes)


def test_a_suggestion_takes_the_release_default_and_spelling() -> None:
    rep, tl = _report("--schedule-conservativeness", (0, 5, 23))
    tl.set_config("arg.tp_size", 1, "log")  # the server's arguments were read: a flag left out is at its default
    check_suggestions(rep, [tl])
    (s,) = rep.findings[0].suggestions
    assert s.current == 1.0
    rep, tl = _report("--schedule-conservativeness", (0, 5, 23))  # a scrape alone: the flag may be set to anything
    check_suggestions(rep, [tl])
    (s,) = rep.findings[0].suggestions
    assert s.current is None
    rep, tl = _report("--cuda-graph-max-bs", (0, 5, 23))
    check_suggestions(rep, [tl])
    assert [s.flag for s in rep.findings[0].suggestions] == ["--cuda-graph-max-bs-decode"]


def test_docs_list_every_family() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "catalogue.md").read_text()
    for f in templates.FAMILIES:
        assert f"| `{f.name}` |" in doc, f"docs/catalogue.md does not describe family {f.name}"
        assert f.meaning and f.cite


@pytest.mark.parametrize("line", [
    "Decode out of memory. This should never happen.",
    "Out of memory. Try to lower your batch size.",
])
def test_oom_shapes_the_oom_pattern_missed(line: str) -> None:
    c = _compiled(re.escape(line.split(".")[0]), "0.5.23")
    _, tl = read_log_bytes(_log([templates.instance(c) or ""]), "server.log", "line")
    assert [e.kind for e in tl.events] == ["oom"]


def test_pool_below_context_line() -> None:
    c = _compiled(r"^KV pool holds", "0.5.23")
    body = templates.instance(c, {c.keys[0]: "3000", c.keys[1]: "8192"})
    _, tl = read_log_bytes(_log([body or ""]), "server.log", "line")
    assert tl.cfg("max_total_tokens") == 3000 and tl.cfg("context_len") == 8192


@pytest.mark.parametrize("how", READ_PATHS)
def test_hybrid_pool_lines(how: str) -> None:
    """SWA and mamba pool sizes (model_runner_kv_cache_mixin.py, mem_cache/memory_pool.py), which the reader
    had no trigger for."""
    swa = _compiled(r"^Use sliding window memory pool\. full_layer_tokens=", "0.5.9")
    mamba = _compiled(r"^Mamba Cache is allocated\. max_mamba_cache_size", "0.5.23")
    lines = [templates.instance(swa, {"full_layer_tokens": "120000", "swa_layer_tokens": "480000"}),
             templates.instance(mamba, {"max_mamba_cache_size": "96"})]
    _, tl = read_log_bytes(_log([x or "" for x in lines]), "server.log", how)
    assert tl.cfg("max_total_tokens_swa") == 480000 and tl.cfg("max_total_tokens") == 120000
    assert tl.cfg("mamba_cache_size") == 96


def test_flags_tsv_is_the_server_args_data() -> None:
    """flags.tsv (read on the start-up path, no JSON) says what server_args.json.gz says."""
    from_json = sorted((c["flag"], a["field"] or "", bool(c["deprecated"]), tuple(tuple(r) for r in a["releases"]))
                       for a in catalogue.server_args() for c in a["cli"])
    from_tsv = sorted((f, fld or "", dep, rng) for f, fld, dep, _d, rng in catalogue.flag_rows())
    assert catalogue.releases() == tuple(__import__("json").loads((catalogue.HERE / "releases.json").read_text()))
    assert from_tsv == from_json
    defaults = {(c["flag"], tuple(tuple(r) for r in a["releases"])): a["default"] for a in catalogue.server_args() for c in a["cli"]}
    for f, _fld, _dep, d, rng in catalogue.flag_rows():
        if isinstance(defaults[(f, rng)], int | float | bool) or defaults[(f, rng)] is None:
            assert d == defaults[(f, rng)], f


# -- coverage under every prefix shape (issue 24 item 4) ----------------------------------------------
def test_every_recognised_template_reads_the_same_under_every_prefix_shape() -> None:
    """Each recognised template's instances (deduplicated across releases), wrapped in every shape of
    prefixshapes.SHAPES (the ones tests/test_log_prefixes.py reads a real log in), give the same recognised
    line, event kinds, signal values and config facts through the line parser and both bulk paths as the
    line parser gives them under SGLang's own prefix."""
    from diagnoser.engines.sglang import prefixshapes

    rows, misses = coverage.shape_check()
    assert set(rows) == set(prefixshapes.SHAPES) and len(rows) >= 16
    n = rows["plain"]["instances"]
    assert n > 200
    assert not misses, "\n".join(f"{m.template.id} {m.shape} {m.path}: {m.line[:120]}\n  want {m.expected}\n  got  {m.got}"
                                 for m in misses[:10])
    assert all(r == {"instances": n, "same": n, "missed": 0} for r in rows.values())


def test_shape_check_fails_when_a_shape_hides_the_message() -> None:
    """The check can fail: a shape that buries the message in prose is read otherwise, and is reported."""
    from diagnoser.engines.sglang import prefixshapes

    prefixshapes.SHAPES["prose"] = prefixshapes.Wrapper(lambda raw, d, t, msg, s, tags: f"the scheduler then said that {msg}")
    try:
        rows, misses = coverage.shape_check(("prose",), paths=("line",))
    finally:
        del prefixshapes.SHAPES["prose"]
    assert rows["prose"]["missed"] > 20 and {m.shape for m in misses} == {"prose"}


def test_coverage_shapes_command(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main

    assert main(["catalogue", "coverage", "--shapes"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^custom_brackets\s+(\d+)\s+\1\s+0$", out, re.M), out
    assert re.search(r"^json_nested\s+(\d+)\s+\1\s+0$", out, re.M), out
    assert "0 (instance, shape, path) read otherwise" in out


def test_docs_show_the_shape_table() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "catalogue.md").read_text()
    rows, _ = coverage.shape_check()
    assert coverage.shape_table(rows, markdown=True) in doc, \
        "docs/catalogue.md's shape table is stale: diagnose catalogue coverage --shapes --format markdown"
