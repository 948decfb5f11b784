"""Live scenarios: the real ``diagnose`` against a real SGLang 0.5.23 engine on CPU while load runs.

Each induces one bottleneck (tests/engine/README.md, "Inducing each bottleneck") and asserts
ranges and presence, never exact counts (runs vary).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.engine import support
from tests.engine.conftest import diagnose_bin

pytestmark = pytest.mark.engine


def run_diagnose(engine: support.Engine, duration: float = 16, extra: list[str] | None = None) -> dict[str, Any]:
    cmd = [diagnose_bin(), "--once", "--url", engine.url, "--log", str(engine.log_path), "--duration", str(duration),
           "--interval", "2", "--format", "json", *(extra or [])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    assert p.returncode in (0, 1), f"diagnose exited {p.returncode}: {p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


def with_load(engine: support.Engine, load: dict[str, Any], warmup: float, fn: Any,
              until: bytes | None = None, until_timeout: float = 90.0) -> tuple[Any, support.LoadResult]:
    """Run ``fn`` while the load runs; stop sending once it returns (requests in flight finish on their own).

    ``fn`` starts ``warmup`` seconds into the load, or, with ``until``, once the server log holds that
    text (at most ``until_timeout`` s): a slow or busy machine reaches the induced state later, and the
    diagnosis window should cover the state, not the ramp-up."""
    stop = threading.Event()
    res = support.LoadResult()
    t = threading.Thread(target=lambda: support.run_load(engine.url, stop=stop, result=res, **load), daemon=True)
    t.start()
    time.sleep(warmup)
    if until is not None:
        deadline = time.time() + until_timeout
        while until not in engine.log_path.read_bytes():
            if time.time() > deadline or not t.is_alive():
                stop.set()
                pytest.fail(f"the induced state never showed: no {until!r} in {engine.log_path} within {until_timeout:.0f} s of load")
            time.sleep(0.5)
    out = fn()
    stop.set()
    t.join(timeout=30)
    return out, res


def headline(doc: dict[str, Any]) -> dict[str, Any]:
    """What the run saw, for assertion messages: max/p50 of the load signals and the findings."""
    sig = next(iter(doc.get("signals", {}).values()), {})
    keep = ("token_usage", "queue_reqs", "running_reqs", "retracted_reqs", "retractions_total", "used_tokens", "kv_available_tokens")
    return {"findings": [(f["rule"], f["summary"]) for f in doc.get("findings", [])],
            "signals": {k: {q: sig[k].get(q) for q in ("n", "p50", "max")} for k in keep if k in sig}}


def by_rule(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in doc["findings"]}


def test_kv_full_with_retraction(engine_factory: Any) -> None:
    eng = engine_factory(["--max-total-tokens", "2048", "--max-running-requests", "64"], "kv-full")
    doc, load = with_load(eng, {"n": 160, "concurrency": 40, "max_new_tokens": 256, "ignore_eos": False}, 4.0,
                          lambda: run_diagnose(eng, 20), until=b"KV cache pool is full. Retract requests")
    assert load.ok >= 5, load.errors
    rules = by_rule(doc)
    assert "kv_saturation" in rules, headline(doc)
    assert "kv_retraction" in rules, headline(doc)
    retr = rules["kv_retraction"]
    log_refs = [e["source"] for e in retr["evidence"] if "server.log:" in (e.get("source") or "")]
    assert log_refs, retr["evidence"]
    # line numbers count "\n" like grep -n (the log also holds progress bars drawn with "\r")
    lines = eng.log_path.read_bytes().split(b"\n")
    for ref in log_refs:
        n = int(ref.rsplit(":", 1)[1])
        assert b"Retract requests" in lines[n - 1] or b"token usage" in lines[n - 1], lines[n - 1]
    sig = doc["signals"][next(iter(doc["signals"]))]
    assert sig["token_usage"]["max"] >= 0.85
    assert doc["config"][next(iter(doc["config"]))]["max_total_tokens"]["value"] == 2048


def test_slot_cap(engine_factory: Any) -> None:
    eng = engine_factory(["--max-running-requests", "4"], "slot-cap")
    doc, load = with_load(eng, {"n": 120, "concurrency": 40, "max_new_tokens": 128, "ignore_eos": True}, 4.0,
                          lambda: run_diagnose(eng, 16))
    rules = by_rule(doc)
    assert {"max_running_requests_cap", "queue_buildup"} & set(rules), [f["rule"] for f in doc["findings"]]
    sugg = [s for f in doc["findings"] for s in f["suggestions"] if s["flag"] == "--max-running-requests"]
    assert sugg, doc["findings"]
    s = sugg[0]
    assert s["current"] in (4, "4")
    assert float(s["proposed"]) > 4
    assert re.search(r"\d", s.get("effect") or ""), s  # headroom quantified
    sig = doc["signals"][next(iter(doc["signals"]))]
    assert sig["running_reqs"]["max"] <= 4
    assert sig["queue_reqs"]["max"] >= 10


def test_prefill_capped(engine_factory: Any) -> None:
    eng = engine_factory(["--chunked-prefill-size", "128", "--max-prefill-tokens", "128"], "prefill-capped")
    doc, load = with_load(eng, {"n": 60, "concurrency": 16, "max_new_tokens": 16, "prompt_reps": 120, "ignore_eos": True}, 4.0,
                          lambda: run_diagnose(eng, 16))
    rules = by_rule(doc)
    assert "prefill_stall" in rules, [f["rule"] for f in doc["findings"]]
    flags = {s["flag"] for s in rules["prefill_stall"]["suggestions"]}
    assert flags & {"--chunked-prefill-size", "--max-prefill-tokens"}, rules["prefill_stall"]
    for s in rules["prefill_stall"]["suggestions"]:
        if s["flag"] in ("--chunked-prefill-size", "--max-prefill-tokens"):
            assert float(s["proposed"]) > 128


def test_client_bound(engine_factory: Any) -> None:
    eng = engine_factory([], "client-bound")
    doc, load = with_load(eng, {"n": 16, "concurrency": 2, "max_new_tokens": 128, "ignore_eos": True}, 3.0,
                          lambda: run_diagnose(eng, 12))
    rules = by_rule(doc)
    assert "client_bound" in rules, [f["rule"] for f in doc["findings"]]
    server_side = [f for f in doc["findings"] if f["severity"] in ("warning", "critical") and f["rule"] != "client_bound"]
    assert not server_side, server_side
