"""One diagnosis of a live vLLM ``/metrics`` by diagnoser against the same by vllm-doctor, same run.

Both tools read one real vLLM 0.32 CPU recording (``tests/data/vllm-cpu-real/kv-full-preemption``) served by
``diagnose replay-server`` on loopback. Each round runs, one after the other, ``vllm-doctor diagnose URL -o json``
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
import time
import urllib.request
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


def timed(cmd: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - t0, p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vllm_doctor", help="path to the vllm-doctor executable (its own venv)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="0", help="diagnoser's sampling window (default 0: one scrape)")
    a = ap.parse_args()
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
        server.terminate()
        server.wait(timeout=10)
    v, d = statistics.median(vd_t), statistics.median(dg_t)
    print(f"median wall time: vllm-doctor {v:.2f} s, diagnoser {d:.2f} s; ratio diagnoser/vllm-doctor {d / v:.2f}")
    return 0 if d <= v else 1


if __name__ == "__main__":
    sys.exit(main())
