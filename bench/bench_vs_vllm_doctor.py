"""One diagnosis of a live vLLM ``/metrics`` by diagnoser against the same by vllm-doctor, same run.

Both tools read one real vLLM 0.32 CPU recording (``tests/data/vllm-cpu-real/kv-full-preemption``) on
loopback: by default one scrape of it under load (``--scrape 4``: KV usage 1.0, 11 waiting, 78 preemptions)
served as it was recorded, with the run's ``/version`` and ``/v1/models``; ``--scrape 0`` plays the whole
recording with ``diagnose replay-server`` instead (its start-up log comes first, so a tool scraping early
reads the first, idle scrape). Each round runs, one after the other, ``vllm-doctor diagnose URL -o json``
(one scrape, the way it reads a ``/metrics`` URL) and ``diagnose --once --url URL --duration D --format json``
(diagnoser samples for ``D`` seconds, default 0: the first scrape only, like vllm-doctor). The
wall time of each process (start-up included, as a user meets it) is taken per round; the ratio is
diagnoser's median over vllm-doctor's median in the same run. The machine's load is the same for both.

vllm-doctor is not a dependency of this project: install it in a venv of its own
(``python3 -m venv /tmp/vd && /tmp/vd/bin/pip install vllm-doctor==0.6.0``) and pass its executable.

Run: ``.venv/bin/python bench/bench_vs_vllm_doctor.py /tmp/vd/bin/vllm-doctor [--rounds 5] [--duration 0]``
(exits 1 when diagnoser is slower than vllm-doctor).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "vllm-cpu-real" / "kv-full-preemption"
DIAGNOSE = [sys.executable, "-m", "diagnoser"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"replay-server did not answer at {url}")


def serve_scrape(n: int) -> ThreadingHTTPServer:
    """Serve the recording's n-th scrape at /metrics (and /version, /v1/models) as the server answered."""
    body = {"/metrics": (sorted((RECORDING / "metrics").glob("*.prom"))[n - 1].read_bytes(), "text/plain; version=0.0.4; charset=utf-8"),
            "/version": ((RECORDING / "version.json").read_bytes(), "application/json"),
            "/v1/models": ((RECORDING / "v1_models.json").read_bytes(), "application/json")}

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            got = body.get(self.path.split("?")[0])
            self.send_response(200 if got else 404)
            self.send_header("Content-Type", got[1] if got else "text/plain")
            self.end_headers()
            self.wfile.write(got[0] if got else b"not found")

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def timed(cmd: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - t0, p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vllm_doctor", help="path to the vllm-doctor executable (its own venv)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="0", help="diagnoser's sampling window (default 0: one scrape)")
    ap.add_argument("--scrape", type=int, default=4, help="serve this recorded scrape (1-based); 0: replay-server, the whole recording")
    a = ap.parse_args()
    server: subprocess.Popen[bytes] | None = None
    one: ThreadingHTTPServer | None = None
    if a.scrape:
        one = serve_scrape(a.scrape)
        port = int(one.server_address[1])
    else:
        port = free_port()
        server = subprocess.Popen([*DIAGNOSE, "replay-server", str(RECORDING), "--port", str(port), "--loop", "--speed", "4"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url + "/metrics")
        vd_t: list[float] = []
        dg_t: list[float] = []
        for i in range(a.rounds):
            t, rc, out = timed([a.vllm_doctor, "diagnose", url + "/metrics", "-o", "json"])
            vd_t.append(t)
            vd = json.loads(out)
            vd_fired = [c["id"] for c in vd["checks"] if c["finding"]]
            t, rc2, out = timed([*DIAGNOSE, "--once", "--url", url, "--duration", a.duration, "--format", "json"])
            dg_t.append(t)
            dg = json.loads(out)
            dg_fired = [f"{f['rule']}({f['severity']})" for f in dg.get("findings", [])]
            print(f"round {i + 1}: vllm-doctor {vd_t[-1]:.2f} s exit {rc} health {vd['health']} {vd_fired}; "
                  f"diagnoser {dg_t[-1]:.2f} s exit {rc2} engine {dg.get('engine')} {dg_fired}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        if one is not None:
            one.shutdown()
    v, d = statistics.median(vd_t), statistics.median(dg_t)
    print(f"median wall time: vllm-doctor {v:.2f} s, diagnoser {d:.2f} s; ratio diagnoser/vllm-doctor {d / v:.2f}")
    return 0 if d <= v else 1


if __name__ == "__main__":
    sys.exit(main())
