"""Record the reservation-bound scenario on the real SGLang 0.5.23 CPU engine (issue 25's second bullet).

    python tests/data/sglang-cpu-issue25/reservation-bound/record.py OUT_DIR   (any Python; the engine is tests/engine's)

The 94M random Llama, ``--max-total-tokens 4096``; 48 clients for 90 s, each request a unique prompt of about
100 tokens and ``max_new_tokens`` drawn from 256-512 with ``ignore_eos``. At v0.5.23 a running request with
``ignore_eos`` reserves its whole remaining output (``PrefillAdder._get_running_request_total_token_offset``:
ratio 1.0, not ``new_token_ratio``), so every running request holds prompt + max_new_tokens of the pool from
its admission on: about 4096 / (100 + 384) = 8 run, the rest wait, and usage reads low early in the decode.
"""
import http.client
import json
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
from tests.engine.support import Engine, LoadResult, RunRecorder, engine_dir, ensure_model  # noqa: E402

OUT = Path(sys.argv[1])
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 90.0
py = engine_dir() / "venv" / "bin" / "python"
model = ensure_model(py, name="llama-94m", hidden=1024, layers=8, heads=16, kv_heads=4)
flags = ["--max-total-tokens", "4096"]
eng = Engine(py=py, model=model, flags=flags, workdir=OUT.parent / "work-reservation").start(timeout=600)
print("started in", round(eng.startup_s), "s", flush=True)
try:
    rec = RunRecorder(eng, OUT, interval=2.0)
    res = LoadResult()
    lock = threading.Lock()
    counter = iter(range(100000))
    deadline = time.time() + SECONDS
    sizes: list[int] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.time() < deadline:
            with lock:
                i = next(counter)
                res.sent += 1
            new = rng.randint(256, 512)
            text = f"# request {i}\n" + " ".join(str(rng.randint(0, 99999)) for _ in range(30)) + "\n"
            body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": new, "ignore_eos": True, "temperature": 1.0}})
            try:
                c = http.client.HTTPConnection("127.0.0.1", eng.port, timeout=max(1.0, deadline - time.time() + 5))
                c.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                c.close()
                meta = json.loads(data).get("meta_info", {}) if r.status == 200 else {}
                with lock:
                    if r.status == 200:
                        res.ok += 1
                        res.completion_tokens += int(meta.get("completion_tokens", 0))
                        sizes.append(int(meta.get("prompt_tokens", 0)))
                    else:
                        res.failed += 1
            except Exception as e:
                with lock:
                    res.failed += 1
                    if len(res.errors) < 5:
                        res.errors.append(f"{type(e).__name__}: {e}")

    t0 = time.time()
    ths = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(48)]
    for t in ths:
        t.start()
    while time.time() < deadline:
        time.sleep(1)
    res.wall_s = time.time() - t0
    rec.finish(res, flags, note=f"48 clients for {SECONDS:.0f} s, /generate with a unique prompt of 30 random numbers and max_new_tokens "
                             f"uniform in 256-512 with ignore_eos; the requests in flight at the end (sent - ok - failed) were "
                             f"cut by the shutdown; prompt tokens of the answered ones: {sorted(set(sizes))[:10]}")
    print("sent", res.sent, "ok", res.ok, "failed", res.failed, res.errors[:2], "scrapes", rec.scrapes, flush=True)
finally:
    eng.stop()
