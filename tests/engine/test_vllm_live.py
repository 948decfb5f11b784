"""diagnoser's live surfaces against one real vLLM 0.32.0 server on CPU under a ``--max-num-seqs 2`` cap:

* ``diagnose --once --url`` (text and JSON) reads it as vLLM 0.32.0 and names the slot cap as the top
  cause, with the fix in vLLM's spelling (``--max-num-seqs``);
* ``diagnose serve`` watching that server and an SGLang target (``diagnose replay-server`` serving a real
  SGLang 0.5.23 recording, tests/data/sglang-cpu-real/kv-full-retract, to spare the memory of a second
  engine) shows both targets, each with its engine, in ``/index.json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.serve_proc import Serve
from tests.engine import vllm_support
from tests.engine.conftest import diagnose_bin
from tests.helpers import free_port

pytestmark = [pytest.mark.engine, pytest.mark.vllm_engine]

DATA = Path(__file__).resolve().parents[1] / "data"


def test_vllm_live_once_and_serve_beside_sglang(vllm_factory: Any, tmp_path: Path) -> None:
    eng = vllm_factory(["--max-model-len", "512", "--max-num-seqs", "2"], "vllm-live")
    stop = threading.Event()
    load = threading.Thread(target=vllm_support.run_load, args=(eng.url, 4000, 16, 128), kwargs={"stop": stop, "timeout": 400},
                            daemon=True)
    port = free_port()
    sglang_url = f"http://127.0.0.1:{port}"
    replay = subprocess.Popen([diagnose_bin(), "replay-server", str(DATA / "sglang-cpu-real" / "kv-full-retract"), "--port", str(port),
                               "--loop"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    serve = None
    try:
        # serve starts before the load, so its start-up does not compete with 16 clients for the CPUs
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(sglang_url + "/metrics", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        serve = Serve(["--url", eng.url, "--url", sglang_url, "--interval", "2", "--for", "0"], tmp_path / "serve.log")
        load.start()
        # the window opens once the cap holds: 2 running, the rest waiting (however slowly the machine admits them)
        state = vllm_support.wait_for_state(eng.url, lambda g: g.get("running") == 2 and g.get("waiting", 0) >= 4, timeout=150, least=10)
        # 1. --once --url: the engine, its release, the top cause and vLLM's flag
        p = subprocess.run([diagnose_bin(), "--once", "--url", eng.url, "--duration", "16", "--interval", "2", "--format", "json"],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr[-2000:]
        doc = json.loads(p.stdout)
        assert doc["engine"] == "vllm" and vllm_support.release_seen(doc["version"]), (doc.get("engine"), doc.get("version"))
        top = next(iter(doc["top"].values()))
        assert top["rule"] == "max_running_requests_cap", (state, [(f["rule"], f["severity"], f["summary"]) for f in doc["findings"]])
        # /metrics alone does not carry max_num_seqs (the cap is inferred, "not in the inputs"): current may be unknown
        sug = top["suggestion"]
        assert sug and sug["flag"] == "--max-num-seqs" and sug["current"] in (2, None) and float(sug["proposed"]) > 2, top
        # with the log (its non-default args line) the current value is known, and the text report says it in vLLM's flags
        text = subprocess.run([diagnose_bin(), "--once", "--url", eng.url, "--log", str(eng.log_path), "--duration", "6", "--interval", "2"],
                              capture_output=True, text=True, timeout=120)
        assert "vllm" in text.stdout.lower() and re.search(r"--max-num-seqs 2 → \d+", text.stdout), text.stdout[-3000:]
        assert "--max-running-requests" not in text.stdout, text.stdout[-3000:]  # SGLang's spelling never reaches a vLLM user

        # 2. serve: the vLLM server and an SGLang target side by side, each with its engine
        kv = {"kv_saturation", "kv_retraction", "queue_buildup"}

        def both() -> Any:  # both scraped, each showing its own bottleneck
            targets = serve.get("/index.json").json()["targets"]  # type: ignore[union-attr]
            rules = [{f["rule"] for f in t["findings"]} for t in targets]
            return targets if len(targets) == 2 and "max_running_requests_cap" in rules[0] and kv & rules[1] else None

        try:
            targets = serve.wait_for(both, timeout=120, what="both targets with their bottlenecks")
        except AssertionError:
            targets = serve.get("/index.json").json()["targets"]
            raise AssertionError([(t["name"], t.get("engine"), t["scrapes"], [f["rule"] for f in t["findings"]]) for t in targets]) from None
        by_url = {t["name"]: t for t in targets}  # type: ignore[union-attr]
        v, s = by_url[eng.url], by_url[sglang_url]
        assert v.get("engine") == "vllm" and s.get("engine") == "sglang", targets
        assert v["version"] == vllm_support.VLLM_VERSION and s["version"] == "0.5.23", targets
        assert "max_running_requests_cap" in {f["rule"] for f in v["findings"]}, v["findings"]
        assert {"kv_saturation", "kv_retraction", "queue_buildup"} & {f["rule"] for f in s["findings"]}, s["findings"]
    finally:
        stop.set()
        if serve is not None:
            serve.close()
        replay.terminate()
        try:
            replay.wait(timeout=10)
        except subprocess.TimeoutExpired:
            replay.kill()
        eng.stop()
