"""Record the aborts scenario on the real SGLang 0.5.23 CPU engine: half the streaming clients disconnect early.

    python tests/data/sglang-cpu-issue25/aborts-half-disconnect/record.py OUT_DIR   (any Python; the engine is tests/engine's)
"""
import http.client
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
from tests.engine.support import Engine, LoadResult, RunRecorder, engine_dir, ensure_model  # noqa: E402

OUT = Path(sys.argv[1])
py = engine_dir() / "venv" / "bin" / "python"
model = ensure_model(py)
flags: list[str] = []
eng = Engine(py=py, model=model, flags=flags, workdir=OUT.parent / "work").start(timeout=400)
print("started in", round(eng.startup_s), "s", flush=True)
try:
    rec = RunRecorder(eng, OUT, interval=2.0)
    res = LoadResult()
    gone = [0]
    lock = threading.Lock()
    counter = iter(range(100000))
    deadline = time.time() + 60
    base = "def f(x):\n    return x + 1\n" * 4

    def worker() -> None:
        while time.time() < deadline:
            with lock:
                i = next(counter)
                res.sent += 1
            body = json.dumps({"text": f"# request {i}\n" + base, "stream": True,
                               "sampling_params": {"max_new_tokens": 256, "ignore_eos": True, "temperature": 1.0}})
            try:
                c = http.client.HTTPConnection("127.0.0.1", eng.port, timeout=60)
                c.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                if i % 2 == 0:  # half the clients disconnect after the first chunks
                    r.read(200)
                    c.sock.close() if c.sock else None
                    c.close()
                    with lock:
                        gone[0] += 1
                    continue
                r.read()
                c.close()
                with lock:
                    res.ok += 1
            except Exception as e:
                with lock:
                    res.failed += 1
                    if len(res.errors) < 5:
                        res.errors.append(f"{type(e).__name__}: {e}")

    t0 = time.time()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(16)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=120)
    res.wall_s = time.time() - t0
    time.sleep(6)  # the aborts reach the counters; two more scrapes
    rec.finish(res, flags, note=f"16 streaming clients for 60 s, max_new_tokens 256 ignore_eos; every even request read 200 bytes "
                             f"of its stream and closed the connection ({gone[0]} disconnected)")
    print("sent", res.sent, "ok", res.ok, "gone", gone[0], "failed", res.failed, res.errors, "scrapes", rec.scrapes, flush=True)
finally:
    eng.stop()
